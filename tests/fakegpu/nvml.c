/* Fake libnvidia-ml.so.1: NVML's C ABI (as nvidia-ml-py calls it) over the topology file.
 * Handles are pointers into the static topology: a struct fg_gpu or a struct fg_mig. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "topology.h"

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_TEMPERATURE_GPU 0
#define NVML_VALUE_NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFull /* usedGpuMemory NVML cannot tell */
#define NVML_MEMORY_V2_VERSION 0x02000028u /* sizeof(nvmlMemory_v2_t) | 2 << 24 */
#define NVML_MAX_MIG_DEVICES 7             /* an A100/H100 has room for at most 7 MIG devices */

typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

/* Layout of nvmlPciInfo_t before NVML 9 (the _v1/_v2 entry points): 52 bytes. */
typedef struct {
    char busId[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    unsigned reserved0, reserved1, reserved2, reserved3;
} nvmlPciInfo_v2_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t; /* _v2 and _v3 */

static struct fg_topology topo;
static int refcount;
static char lock_flag;  /* fg_lock/fg_unlock: init and shutdown may race across threads */
static char state_lock; /* the fault file's reading and the event sets */

static int initialized(void)
{
    return __atomic_load_n(&refcount, __ATOMIC_ACQUIRE) > 0;
}

/* ------------------------------------------------------------- handles ---- */

/* A card's health now: the topology's overlaid by $FAKEGPU_FAULTS, re-read at every call so that a test
 * can break a card under a running process. UNKNOWN while the fault file is malformed. */
static nvmlReturn_t health_now(const struct fg_gpu *g, struct fg_health *out)
{
    static struct fg_health live[FG_MAX_GPUS];
    enum fg_load_status st;
    int nvml_init;
    fg_lock(&state_lock);
    st = fg_faults_load(&topo, live, &nvml_init);
    *out = live[g - topo.gpus];
    fg_unlock(&state_lock);
    return st == FG_LOAD_OK ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

/* Whether the card answers: GPU_IS_LOST once it is lost; its health in *health. */
static nvmlReturn_t reachable(const struct fg_gpu *g, struct fg_health *health)
{
    nvmlReturn_t rc = health_now(g, health);
    if (rc != NVML_SUCCESS)
        return rc;
    return health->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

/* Resolves a handle into its GPU and, for a MIG handle, its MIG device (whose health is its card's). */
static nvmlReturn_t resolve_health(nvmlDevice_t h, struct fg_gpu **gpu, struct fg_mig **mig, struct fg_health *health)
{
    const char *p = (const char *)h;
    int i;
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!h)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < topo.ngpus; i++) {
        struct fg_gpu *g = &topo.gpus[i];
        const char *mig0 = (const char *)&g->mig[0];
        *gpu = g;
        *mig = NULL;
        if (p == (const char *)g)
            return reachable(g, health);
        if (p >= mig0 && p < (const char *)&g->mig[g->nmig] && (size_t)(p - mig0) % sizeof(g->mig[0]) == 0) {
            *mig = (struct fg_mig *)(void *)p;
            return reachable(g, health);
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

static nvmlReturn_t resolve(nvmlDevice_t h, struct fg_gpu **gpu, struct fg_mig **mig)
{
    struct fg_health health;
    return resolve_health(h, gpu, mig, &health);
}

#define RESOLVE(h)                                              \
    struct fg_gpu *g;                                           \
    struct fg_mig *m;                                           \
    nvmlReturn_t rc_ = resolve((h), &g, &m);                    \
    if (rc_ != NVML_SUCCESS)                                    \
        return rc_

static nvmlReturn_t copy_str(char *dst, unsigned length, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- init ---- */

static void reset_event_sets(void);

/* What the fault file's "nvml_init" makes nvmlInit return (UNKNOWN while the file is malformed). */
static nvmlReturn_t fault_file_init(void)
{
    static struct fg_health live[FG_MAX_GPUS];
    int nvml_init;
    enum fg_load_status st;
    fg_lock(&state_lock);
    st = fg_faults_load(&topo, live, &nvml_init);
    fg_unlock(&state_lock);
    return st == FG_LOAD_OK ? nvml_init : NVML_ERROR_UNKNOWN;
}

API nvmlReturn_t nvmlInitWithFlags(unsigned flags)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    (void)flags; /* NO_GPUS would only matter with zero cards, and zero cards initialise anyway */
    fg_lock(&lock_flag);
    if (refcount == 0) {
        switch (fg_topology_load(&topo)) {
        case FG_LOAD_OK:
            rc = topo.nvml_init_fault ? topo.nvml_init_fault : fault_file_init();
            break;
        case FG_LOAD_MISSING:
            rc = NVML_ERROR_DRIVER_NOT_LOADED;
            break;
        default:
            rc = NVML_ERROR_UNKNOWN;
            break;
        }
    }
    if (rc == NVML_SUCCESS && refcount == 0)
        reset_event_sets(); /* sets do not outlive the last nvmlShutdown */
    if (rc == NVML_SUCCESS)
        __atomic_add_fetch(&refcount, 1, __ATOMIC_RELEASE);
    fg_unlock(&lock_flag);
    return rc;
}

API nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

API nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

API nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    fg_lock(&lock_flag);
    if (refcount == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else
        __atomic_sub_fetch(&refcount, 1, __ATOMIC_RELEASE);
    fg_unlock(&lock_flag);
    return rc;
}

/* NVML's own strings, measured (driver 580.159.04). nvidia-ml-py prints its own text for
 * the codes it knows (e.g. 18), so str(NVMLError) may differ from these. */
API const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt Request Issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires reset";
    case 17: return "GPU access blocked by the operating system";
    case 18: return "Driver/library version mismatch";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 22: return "vGPU ECC not supported";
    case 23: return "Insufficient Resources";
    case 24: return "Invalid Frequency";
    case 25: return "Argument version mismatch";
    case 26: return "Requested functionality has been deprecated";
    case 27: return "System is not in ready state";
    case 28: return "No supported GPUs were found";
    case 29: return "Resource not in correct state to perform requested operation";
    case 30: return "Reset type is not supported for given device";
    default: return "Unknown Error";
    }
}

/* -------------------------------------------------------------- system ---- */

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned length)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    return copy_str(version, length, topo.driver_version);
}

/* NVML's version is "<CUDA major>.<driver version>", e.g. "13.580.159.04". */
API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned length)
{
    char buf[FG_VERSION_LEN + 16];
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    snprintf(buf, sizeof(buf), "%d.%s", topo.cuda_driver_version / 1000, topo.driver_version);
    return copy_str(version, length, buf);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = topo.cuda_driver_version;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ----------------------------------------------------------- enumerate ---- */

/* Lost cards count: NVML still sees them on the bus list, their handles fail. */
API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *deviceCount)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = (unsigned)topo.ngpus;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCount(unsigned *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

static nvmlReturn_t give_gpu(struct fg_gpu *g, nvmlDevice_t *device)
{
    struct fg_health health;
    nvmlReturn_t rc = reachable(g, &health);
    if (rc != NVML_SUCCESS)
        return rc;
    *device = (nvmlDevice_t)(void *)g;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t *device)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned)topo.ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    return give_gpu(&topo.gpus[index], device);
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    int i, j;
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < topo.ngpus; i++) {
        struct fg_gpu *g = &topo.gpus[i];
        /* Measured: the exact UUID, or the same without "GPU-"; case and prefixes do not match. */
        if (strcmp(g->uuid, uuid) == 0 || strcmp(g->uuid + 4, uuid) == 0)
            return give_gpu(g, device);
        for (j = 0; j < g->nmig; j++) {
            if (strcmp(g->mig[j].uuid, uuid) == 0) {
                struct fg_health health;
                nvmlReturn_t rc = reachable(g, &health);
                if (rc == NVML_SUCCESS)
                    *device = (nvmlDevice_t)(void *)&g->mig[j];
                return rc;
            }
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    unsigned d, b, dev, f;
    int i;
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    /* Measured: a non-zero function is an invalid argument; an absent card is NOT_FOUND. */
    if (!pciBusId || !device || fg_parse_bus_id(pciBusId, &d, &b, &dev, &f) < 0 || f != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < topo.ngpus; i++) {
        struct fg_gpu *g = &topo.gpus[i];
        if (g->domain == d && g->bus == b && g->device == dev)
            return give_gpu(g, device);
    }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

/* ------------------------------------------------------------- queries ---- */

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned length)
{
    RESOLVE(device);
    return copy_str(uuid, length, m ? m->uuid : g->uuid);
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned length)
{
    RESOLVE(device);
    return copy_str(name, length, m ? m->name : g->name);
}

/* A MIG device reports its parent's PCI location. Like NVML, only the fields of each version
 * are written and strings are not padded: v1 stops after pciDeviceId, v2 after pciSubSystemId. */
API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    RESOLVE(device);
    (void)m;
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.%X", g->domain & 0xFFFFu, g->bus,
             g->device, g->function);
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->device;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
    snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.%X", g->domain, g->bus, g->device, g->function);
    return NVML_SUCCESS;
}

static nvmlReturn_t pci_info_old(nvmlDevice_t device, nvmlPciInfo_v2_t *pci, int with_subsystem)
{
    RESOLVE(device);
    (void)m;
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(pci->busId, sizeof(pci->busId), "%04X:%02X:%02X.%X", g->domain & 0xFFFFu, g->bus, g->device,
             g->function);
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->device;
    pci->pciDeviceId = g->pci_device_id;
    if (with_subsystem)
        pci->pciSubSystemId = g->pci_subsystem_id;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_v2_t *pci)
{
    return pci_info_old(device, pci, 1);
}

API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_v2_t *pci)
{
    return pci_info_old(device, pci, 0);
}

static void memory_of(const struct fg_gpu *g, const struct fg_mig *m, unsigned long long *total,
                      unsigned long long *used)
{
    *total = (m ? m->memory_total_mib : g->memory_total_mib) << 20;
    *used = (m ? m->memory_used_mib : g->memory_used_mib) << 20;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    RESOLVE(device);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory_of(g, m, &memory->total, &memory->used);
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

/* The fake reserves nothing: reserved is 0 and total = used + free, as in v1. Measured: any
 * other version than nvmlMemory_v2 gets FUNCTION_NOT_FOUND. */
API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    RESOLVE(device);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != NVML_MEMORY_V2_VERSION)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    memory_of(g, m, &memory->total, &memory->used);
    memory->reserved = 0;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

/* NVML has no utilization counters for a MIG device, nor for a card in MIG mode (nvml.h: "On MIG-enabled
 * GPUs, querying device utilization rates is not currently supported"). */
API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    RESOLVE(device);
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m || g->mig_mode == 1)
        return NVML_ERROR_NOT_SUPPORTED;
    utilization->gpu = g->utilization_gpu;
    utilization->memory = g->utilization_memory;
    return NVML_SUCCESS;
}

/* Optional readings of a whole card (temperature in degrees C, power in milliwatts): NOT_SUPPORTED where the
 * topology gives none, and on a MIG handle (not measured: the sensors are the card's). */
static nvmlReturn_t reading(const struct fg_mig *m, long long value, unsigned *out)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m || value == FG_UNSUPPORTED)
        return NVML_ERROR_NOT_SUPPORTED;
    *out = (unsigned)value;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensorType, unsigned *temp)
{
    RESOLVE(device);
    if (sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    return reading(m, g->temperature_c, temp);
}

API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned *power)
{
    RESOLVE(device);
    return reading(m, g->power_draw_mw, power);
}

/* Total energy since an epoch, millijoules: the card's power draw integrated over CLOCK_BOOTTIME, so the counter
 * grows with the draw over time and every process reads the same value at the same moment (as the driver's does). */
API nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy)
{
    RESOLVE(device);
    if (!energy)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m || g->power_draw_mw == FG_UNSUPPORTED)
        return NVML_ERROR_NOT_SUPPORTED;
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    unsigned long long ms = (unsigned long long)ts.tv_sec * 1000ULL + (unsigned long long)ts.tv_nsec / 1000000ULL;
    *energy = (unsigned long long)g->power_draw_mw * ms / 1000ULL;
    return NVML_SUCCESS;
}

/* Persistence mode (0 off, 1 on): a card's setting, so a MIG handle is refused as the real driver refuses it. */
API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, unsigned *mode)
{
    RESOLVE(device);
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m)
        return NVML_ERROR_NOT_SUPPORTED;
    *mode = (unsigned)g->persistence_mode;
    return NVML_SUCCESS;
}

/* The fake has one limit: the enforced one is the management one (no external cap). */
API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned *limit)
{
    RESOLVE(device);
    return reading(m, g->power_limit_mw, limit);
}

API nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned *limit)
{
    return nvmlDeviceGetEnforcedPowerLimit(device, limit);
}

/* NVML's two-call protocol: a too-small *infoCount (0 with infos NULL to ask) gets
 * INSUFFICIENT_SIZE and the needed count; no processes is SUCCESS with 0. A MIG handle
 * sees the processes of its own GPU/compute instance only. Compute or graphics clients: the
 * topology's, then those of the processes file (fg_file_processes), re-read on each call. */
static nvmlReturn_t processes(nvmlDevice_t device, unsigned *infoCount, void *infos, int v1, int graphics)
{
    const struct fg_proc *sel[2 * FG_MAX_PROCS];
    struct fg_proc extra[FG_MAX_PROCS];
    unsigned n = 0, i;
    int k, nextra;
    RESOLVE(device);
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    nextra = fg_file_processes(g, m, extra, FG_MAX_PROCS);
    if (nextra < 0)
        return -nextra;
    for (k = 0; k < g->nprocs + nextra; k++) {
        const struct fg_proc *p = k < g->nprocs ? &g->procs[k] : &extra[k - g->nprocs];
        if (p->graphics == graphics &&
            (!m || (p->gpu_instance_id == m->gpu_instance_id && p->compute_instance_id == m->compute_instance_id)))
            sel[n++] = p;
    }
    if (*infoCount < n) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n && !infos)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < n; i++) {
        if (v1) {
            nvmlProcessInfo_v1_t *o = (nvmlProcessInfo_v1_t *)infos + i;
            o->pid = sel[i]->pid;
            o->usedGpuMemory = sel[i]->used_unknown ? NVML_VALUE_NOT_AVAILABLE : sel[i]->used_mib << 20;
        } else {
            nvmlProcessInfo_t *o = (nvmlProcessInfo_t *)infos + i;
            o->pid = sel[i]->pid;
            o->usedGpuMemory = sel[i]->used_unknown ? NVML_VALUE_NOT_AVAILABLE : sel[i]->used_mib << 20;
            o->gpuInstanceId = sel[i]->gpu_instance_id;
            o->computeInstanceId = sel[i]->compute_instance_id;
        }
    }
    *infoCount = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned *infoCount,
                                                         nvmlProcessInfo_t *infos)
{
    return processes(device, infoCount, infos, 0, 0);
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned *infoCount,
                                                         nvmlProcessInfo_t *infos)
{
    return processes(device, infoCount, infos, 0, 0);
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned *infoCount,
                                                      nvmlProcessInfo_v1_t *infos)
{
    return processes(device, infoCount, infos, 1, 0);
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned *infoCount,
                                                          nvmlProcessInfo_t *infos)
{
    return processes(device, infoCount, infos, 0, 1);
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned *infoCount,
                                                          nvmlProcessInfo_t *infos)
{
    return processes(device, infoCount, infos, 0, 1);
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned *infoCount,
                                                       nvmlProcessInfo_v1_t *infos)
{
    return processes(device, infoCount, infos, 1, 1);
}

/* Index, minor number and compute capability of a MIG handle are its parent's. */
API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned *index)
{
    RESOLVE(device);
    (void)m;
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)(g - topo.gpus);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned *minorNumber)
{
    RESOLVE(device);
    (void)m;
    if (!minorNumber)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minorNumber = g->minor_number;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    RESOLVE(device);
    (void)m;
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

/* ----------------------------------------------------------------- MIG ---- */

/* A card without MIG reports 0/0 rather than NOT_SUPPORTED; a MIG handle is not a parent. */
API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned *currentMode, unsigned *pendingMode)
{
    RESOLVE(device);
    if (!currentMode || !pendingMode || m)
        return NVML_ERROR_INVALID_ARGUMENT;
    *currentMode = g->mig_mode;
    *pendingMode = g->mig_pending_mode;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned *count)
{
    RESOLVE(device);
    if (!count || m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g->mig_mode != 1)
        *count = 0;
    else
        *count = g->nmig > NVML_MAX_MIG_DEVICES ? (unsigned)g->nmig : NVML_MAX_MIG_DEVICES;
    return NVML_SUCCESS;
}

/* Callers walk 0..max-1 and skip NOT_FOUND, as with real NVML. */
API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned index, nvmlDevice_t *migDevice)
{
    RESOLVE(device);
    if (!migDevice || m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g->mig_mode != 1 || index >= (unsigned)g->nmig)
        return NVML_ERROR_NOT_FOUND;
    *migDevice = (nvmlDevice_t)(void *)&g->mig[index];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    RESOLVE(migDevice);
    if (!device || !m)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)(void *)g;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned *isMigDevice)
{
    RESOLVE(device);
    (void)g;
    if (!isMigDevice)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = m != NULL;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned *id)
{
    RESOLVE(device);
    (void)g;
    if (!id || !m) /* measured: a whole GPU's instance ids are an invalid argument */
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = m->gpu_instance_id;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned *id)
{
    RESOLVE(device);
    (void)g;
    if (!id || !m) /* measured: a whole GPU's instance ids are an invalid argument */
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = m->compute_instance_id;
    return NVML_SUCCESS;
}

/* -------------------------------------------------------------- health ---- */

/* The memory-error calls read the card's health (a MIG handle: its card's; not measured). Measured on H200:
 * ECC [1, 1] and no errors, retired pages NOT_SUPPORTED (Hopper remaps rows), remapped rows (0, 0, 0, 0). */
#define RESOLVE_HEALTH(dev)                                         \
    struct fg_gpu *g;                                               \
    struct fg_mig *m;                                               \
    struct fg_health h;                                             \
    nvmlReturn_t rc_ = resolve_health((dev), &g, &m, &h);           \
    (void)g;                                                        \
    (void)m;                                                        \
    if (rc_ != NVML_SUCCESS)                                        \
        return rc_;                                                 \
    if (h.memory_query_error)                                       \
        return (nvmlReturn_t)h.memory_query_error

API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, int *current, int *pending)
{
    RESOLVE_HEALTH(device);
    if (!current || !pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!h.ecc_supported)
        return NVML_ERROR_NOT_SUPPORTED;
    *current = (int)h.ecc_mode;
    *pending = (int)h.ecc_pending_mode;
    return NVML_SUCCESS;
}

/* errorType: 0 corrected, 1 uncorrected; counterType: 0 volatile (since the driver loaded), 1 aggregate. */
API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                             unsigned long long *eccCounts)
{
    RESOLVE_HEALTH(device);
    if (!eccCounts || errorType < 0 || errorType > 1 || counterType < 0 || counterType > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!h.ecc_supported || h.ecc_mode == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *eccCounts = h.ecc[errorType][counterType];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, int *isPending)
{
    RESOLVE_HEALTH(device);
    if (!isPending)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (h.row_remapping)
        return NVML_ERROR_NOT_SUPPORTED;
    *isPending = h.retired_pages_pending;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned *corrRows, unsigned *uncRows,
                                           unsigned *isPending, unsigned *failureOccurred)
{
    RESOLVE_HEALTH(device);
    if (!corrRows || !uncRows || !isPending || !failureOccurred)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!h.row_remapping)
        return NVML_ERROR_NOT_SUPPORTED;
    *corrRows = h.remap_corrected;
    *uncRows = h.remap_uncorrected;
    *isPending = h.remap_pending;
    *failureOccurred = h.remap_failure;
    return NVML_SUCCESS;
}

/* -------------------------------------------------------------- events ---- */

#define FG_MAX_EVENT_SETS 64
#define NVML_EVENT_TYPE_XID_CRITICAL 0x8ull
#define FG_SUPPORTED_EVENTS 65439ull /* measured on H200: nvmlDeviceGetSupportedEventTypes */
#define FG_EVENT_POLL_NS 10000000L   /* the fault file is polled every 10 ms while a wait lasts */

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

/* Only XID events are ever delivered: each XID in a card's list once to every set registered for XIDs on it,
 * in the list's order (a set's cursor counts those delivered; a list shortened by the test rewinds it). */
struct fg_event_set {
    int used;
    unsigned long long types[FG_MAX_GPUS];
    int delivered[FG_MAX_GPUS];
};
typedef struct fg_event_set *nvmlEventSet_t;

static struct fg_event_set event_sets[FG_MAX_EVENT_SETS];

static void reset_event_sets(void)
{
    fg_lock(&state_lock);
    memset(event_sets, 0, sizeof(event_sets));
    fg_unlock(&state_lock);
}

static int valid_set(nvmlEventSet_t set)
{
    size_t i = (size_t)(set - event_sets);
    return set && set >= event_sets && i < FG_MAX_EVENT_SETS && set->used;
}

API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    nvmlReturn_t rc = NVML_ERROR_MEMORY;
    int i;
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    fg_lock(&state_lock);
    for (i = 0; i < FG_MAX_EVENT_SETS; i++) {
        if (!event_sets[i].used) {
            memset(&event_sets[i], 0, sizeof(event_sets[i]));
            event_sets[i].used = 1;
            *set = &event_sets[i];
            rc = NVML_SUCCESS;
            break;
        }
    }
    fg_unlock(&state_lock);
    return rc;
}

API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    fg_lock(&state_lock);
    if (valid_set(set))
        set->used = 0;
    else
        rc = NVML_ERROR_INVALID_ARGUMENT;
    fg_unlock(&state_lock);
    return rc;
}

/* A MIG handle: NOT_SUPPORTED (not measured; the events are the card's). */
API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    RESOLVE(device);
    (void)g;
    if (!eventTypes)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m)
        return NVML_ERROR_NOT_SUPPORTED;
    *eventTypes = FG_SUPPORTED_EVENTS;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    RESOLVE(device);
    if (m || (eventTypes & ~FG_SUPPORTED_EVENTS))
        return NVML_ERROR_NOT_SUPPORTED;
    fg_lock(&state_lock);
    if (!valid_set(set)) {
        rc = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        size_t i = (size_t)(g - topo.gpus);
        if ((eventTypes & NVML_EVENT_TYPE_XID_CRITICAL) && !(set->types[i] & NVML_EVENT_TYPE_XID_CRITICAL))
            set->delivered[i] = 0;
        set->types[i] |= eventTypes;
    }
    fg_unlock(&state_lock);
    return rc;
}

/* The next pending event of the set, GPU_IS_LOST when a card it watches is lost, else TIMEOUT. */
static nvmlReturn_t next_event(nvmlEventSet_t set, nvmlEventData_t *data)
{
    static struct fg_health live[FG_MAX_GPUS];
    nvmlReturn_t rc = NVML_ERROR_TIMEOUT;
    int i, nvml_init;
    fg_lock(&state_lock);
    if (!valid_set(set)) {
        rc = NVML_ERROR_INVALID_ARGUMENT;
    } else if (fg_faults_load(&topo, live, &nvml_init) != FG_LOAD_OK) {
        rc = NVML_ERROR_UNKNOWN;
    } else {
        for (i = 0; i < topo.ngpus && rc == NVML_ERROR_TIMEOUT; i++) {
            if (!(set->types[i] & NVML_EVENT_TYPE_XID_CRITICAL))
                continue;
            if (set->delivered[i] > live[i].nxid)
                set->delivered[i] = live[i].nxid;
            if (set->delivered[i] < live[i].nxid) {
                data->device = (nvmlDevice_t)(void *)&topo.gpus[i];
                data->eventType = NVML_EVENT_TYPE_XID_CRITICAL;
                data->eventData = live[i].xid[set->delivered[i]++];
                data->gpuInstanceId = data->computeInstanceId = FG_NO_INSTANCE;
                rc = NVML_SUCCESS;
            }
        }
        for (i = 0; i < topo.ngpus && rc == NVML_ERROR_TIMEOUT; i++)
            if (set->types[i] && live[i].lost)
                rc = NVML_ERROR_GPU_IS_LOST;
    }
    fg_unlock(&state_lock);
    return rc;
}

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Measured on H200: with nothing pending, TIMEOUT after timeoutms. */
API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned timeoutms)
{
    long long deadline = now_ns() + (long long)timeoutms * 1000000;
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!data)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (;;) {
        struct timespec pause = {0, FG_EVENT_POLL_NS};
        long long left;
        nvmlReturn_t rc = next_event(set, data);
        if (rc != NVML_ERROR_TIMEOUT)
            return rc;
        left = deadline - now_ns();
        if (left <= 0)
            return NVML_ERROR_TIMEOUT;
        if (left < pause.tv_nsec)
            pause.tv_nsec = (long)left;
        nanosleep(&pause, NULL);
    }
}

API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned timeoutms)
{
    return nvmlEventSetWait_v2(set, data, timeoutms);
}
