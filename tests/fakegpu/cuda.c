/* Fake libcuda.so.1: the device-query part of the CUDA driver API over the topology file.
 * The device list is fixed at the first cuInit from CUDA_DEVICE_ORDER and CUDA_VISIBLE_DEVICES. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "topology.h"

#define API __attribute__((visibility("default")))

/* cuDeviceGetPCIBusId's format. Real-GPU facts may adjust the case of the hex digits. */
#define FG_CUDA_PCI_BUS_ID_FORMAT "%04X:%02X:%02X.0"

typedef int CUresult;
typedef int CUdevice;
typedef struct {
    char bytes[16];
} CUuuid;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_UNKNOWN = 999,
};

enum {
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
    CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
};

/* A CUDA device: a whole GPU (mig == NULL) or one MIG device of a GPU in MIG mode. */
struct cudev {
    struct fg_gpu *gpu;
    struct fg_mig *mig;
};

#define FG_MAX_CUDEVS (FG_MAX_GPUS * FG_MAX_MIG)

static struct fg_topology topo;
static struct cudev devs[FG_MAX_CUDEVS];
static int ndevs;
static int init_done;     /* cuInit's outcome is sticky, as in CUDA */
static CUresult init_rc;
static char lock_flag; /* fg_lock/fg_unlock: init and shutdown may race across threads */

static const char *cudev_uuid(const struct cudev *d)
{
    return d->mig ? d->mig->uuid : d->gpu->uuid;
}

/* ------------------------------------------------------- enumeration ---- */

/* Which devices a process sees, and in what order: the real driver's rules, all in this
 * function. Measured on 2xH200, driver 580.159.04 (bench/records/); the MIG
 * parts are not measured. Returns the number of devices, or -1 when cuInit must fail with
 * CUDA_ERROR_INVALID_DEVICE.
 *
 * 1. Candidates: every card that is not lost, in PCI bus order. A card in MIG mode is not a
 *    CUDA device itself; its MIG devices take its place, in the order listed.
 * 2. CUDA_DEVICE_ORDER unset or "FASTEST_FIRST": compute capability, highest first, bus order
 *    among equals (MIG devices have their parent's). "PCI_BUS_ID": bus order. Any other value,
 *    even "" or lower case: INVALID_DEVICE.
 * 3. CUDA_VISIBLE_DEVICES unset: every candidate. Otherwise comma-separated entries, and the
 *    first entry decides their kind:
 *    - index: read like strtol (leading blanks, an optional sign, decimal digits, whatever
 *      follows ignored: " 1", "+1", "01", "1abc" all mean 1); negative or too large is invalid;
 *    - UUID: starts with exactly "GPU-" or "MIG-" (either tag finds either kind of device; no
 *      leading blank). The rest, dashes skipped, is compared with each candidate's 32 hex
 *      digits, case-insensitively: the entry ending first makes it a prefix, the digits ending
 *      first a full match (the rest of the entry is ignored). Exactly one candidate must match.
 *    The first invalid entry ends the list, entries before it stay: a bad index, no or an
 *    ambiguous match, an empty entry, an entry of the other kind ("GPU-..,1" keeps only the
 *    first). An empty value or a bad first entry leaves nothing (cuInit: NO_DEVICE).
 *    A device listed twice makes the whole list INVALID_DEVICE ("0,0", "GPU-ab..,GPU-ab"). */
static int cuda_enumerate(struct fg_topology *t, const char *order, const char *visible, struct cudev *out)
{
    struct cudev cand[FG_MAX_CUDEVS];
    int ncand = 0, n = 0, i, j, uuid_kind = -1;
    const char *p;

    for (i = 0; i < t->ngpus; i++) {
        struct fg_gpu *g = &t->gpus[i];
        if (g->health.lost)
            continue;
        if (g->mig_mode == 1) {
            for (j = 0; j < g->nmig; j++)
                cand[ncand++] = (struct cudev){g, &g->mig[j]};
        } else {
            cand[ncand++] = (struct cudev){g, NULL};
        }
    }
    if (order && strcmp(order, "PCI_BUS_ID") != 0 && strcmp(order, "FASTEST_FIRST") != 0)
        return -1;
    if (!order || strcmp(order, "FASTEST_FIRST") == 0) {
        for (i = 1; i < ncand; i++) { /* insertion sort: stable */
            struct cudev d = cand[i];
            int cc = d.gpu->cc_major * 10 + d.gpu->cc_minor;
            for (j = i; j > 0 && cand[j - 1].gpu->cc_major * 10 + cand[j - 1].gpu->cc_minor < cc; j--)
                cand[j] = cand[j - 1];
            cand[j] = d;
        }
    }
    if (!visible) {
        memcpy(out, cand, (size_t)ncand * sizeof(cand[0]));
        return ncand;
    }
    for (p = visible;;) {
        char entry[256];
        size_t len = strcspn(p, ",");
        int found = -1, is_uuid;
        snprintf(entry, sizeof(entry), "%.*s", (int)(len < sizeof(entry) ? len : sizeof(entry) - 1), p);
        is_uuid = strncmp(entry, "GPU-", 4) == 0 || strncmp(entry, "MIG-", 4) == 0;
        if (uuid_kind < 0)
            uuid_kind = is_uuid;
        if (is_uuid != uuid_kind)
            break;
        if (!is_uuid) {
            char *endp;
            long idx;
            errno = 0;
            idx = strtol(entry, &endp, 10);
            if (endp != entry && errno == 0 && idx >= 0 && idx < ncand)
                found = (int)idx;
        } else {
            int matches = 0;
            for (i = 0; i < ncand; i++) {
                const char *e = entry + 4, *u = cudev_uuid(&cand[i]) + 4;
                int digits = 0, match;
                for (;;) {
                    while (*e == '-')
                        e++;
                    while (*u == '-')
                        u++;
                    if (*u == '\0') {
                        match = 1;
                        break;
                    }
                    if (*e == '\0') {
                        match = digits > 0;
                        break;
                    }
                    if (tolower((unsigned char)*e) != tolower((unsigned char)*u)) {
                        match = 0;
                        break;
                    }
                    e++, u++, digits++;
                }
                if (match) {
                    found = i;
                    matches++;
                }
            }
            if (matches != 1)
                found = -1;
        }
        if (found < 0)
            break;
        for (i = 0; i < n; i++)
            if (out[i].gpu == cand[found].gpu && out[i].mig == cand[found].mig)
                return -1;
        out[n++] = cand[found];
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    return n;
}

/* ---------------------------------------------------------------- init ---- */

API CUresult cuInit(unsigned Flags)
{
    CUresult rc;
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    fg_lock(&lock_flag);
    if (!init_done) {
        switch (fg_topology_load(&topo)) {
        case FG_LOAD_OK:
            init_rc = topo.cuda_init_fault;
            if (topo.cuda_init_delay_ms > 0) { /* a driver that hangs in cuInit (a card in a bad state) */
                struct timespec ts = {topo.cuda_init_delay_ms / 1000, (topo.cuda_init_delay_ms % 1000) * 1000000L};
                while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
                    ;
            }
            break;
        case FG_LOAD_MISSING:
            init_rc = CUDA_ERROR_NO_DEVICE;
            break;
        default:
            init_rc = CUDA_ERROR_UNKNOWN;
            break;
        }
        if (init_rc == CUDA_SUCCESS) {
            ndevs = cuda_enumerate(&topo, getenv("CUDA_DEVICE_ORDER"), getenv("CUDA_VISIBLE_DEVICES"), devs);
            if (ndevs < 0)
                init_rc = CUDA_ERROR_INVALID_DEVICE;
            else if (ndevs == 0)
                init_rc = CUDA_ERROR_NO_DEVICE;
            if (init_rc != CUDA_SUCCESS)
                ndevs = 0;
        }
        __atomic_store_n(&init_done, 1, __ATOMIC_RELEASE);
    }
    rc = init_rc;
    fg_unlock(&lock_flag);
    return rc;
}

static CUresult device(CUdevice dev, const struct cudev **out)
{
    if (!__atomic_load_n(&init_done, __ATOMIC_ACQUIRE) || init_rc != CUDA_SUCCESS)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= ndevs)
        return CUDA_ERROR_INVALID_DEVICE;
    *out = &devs[dev];
    return CUDA_SUCCESS;
}

#define DEVICE(dev)                                \
    const struct cudev *d;                         \
    CUresult rc_ = device((dev), &d);              \
    if (rc_ != CUDA_SUCCESS)                       \
        return rc_

/* Works before cuInit, as in CUDA. */
API CUresult cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    fg_lock(&lock_flag);
    if (!init_done && fg_topology_load(&topo) != FG_LOAD_OK)
        topo.cuda_driver_version = FG_DEFAULT_CUDA_VERSION;
    *driverVersion = topo.cuda_driver_version;
    fg_unlock(&lock_flag);
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int *count)
{
    if (!__atomic_load_n(&init_done, __ATOMIC_ACQUIRE) || init_rc != CUDA_SUCCESS)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = ndevs;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    const struct cudev *d;
    CUresult rc = device(ordinal, &d);
    if (rc == CUDA_ERROR_NOT_INITIALIZED)
        return rc;
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    if (rc != CUDA_SUCCESS)
        return rc;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------- queries ---- */

/* Measured: the name is NUL-padded to len; a short buffer gets it truncated, terminated, and
 * success. (The real driver crashes on len 0; the fake refuses it.) */
API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    DEVICE(dev);
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    memset(name, 0, (size_t)len);
    strncpy(name, d->mig ? d->mig->name : d->gpu->name, (size_t)len - 1);
    return CUDA_SUCCESS;
}

/* Measured: a buffer too short gets the truncated, terminated text and INVALID_VALUE. */
API CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    int need;
    DEVICE(dev);
    if (!pciBusId || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    need = snprintf(pciBusId, (size_t)len, FG_CUDA_PCI_BUS_ID_FORMAT, d->gpu->domain, d->gpu->bus, d->gpu->device);
    return need < len ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* _v2 gives a MIG device's own UUID; the original gives its parent GPU's. */
API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    DEVICE(dev);
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    return fg_uuid_bytes(cudev_uuid(d), (unsigned char *)uuid->bytes) == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
}

API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    DEVICE(dev);
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    return fg_uuid_bytes(d->gpu->uuid, (unsigned char *)uuid->bytes) == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
}

API CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev)
{
    DEVICE(dev);
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        *pi = d->gpu->cc_major;
        break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
        *pi = d->gpu->cc_minor;
        break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
        *pi = (int)d->gpu->bus;
        break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
        *pi = (int)d->gpu->device;
        break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
        *pi = (int)d->gpu->domain;
        break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *pi = d->mig ? d->mig->multiprocessor_count : d->gpu->multiprocessor_count;
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

static unsigned long long total_mem(const struct cudev *d)
{
    return (d->mig ? d->mig->memory_total_mib : d->gpu->memory_total_mib) << 20;
}

/* Measured: a bad ordinal still zeroes *bytes before failing. */
API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    const struct cudev *d;
    CUresult rc = device(dev, &d);
    if (rc == CUDA_ERROR_NOT_INITIALIZED)
        return rc;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = 0;
    if (rc != CUDA_SUCCESS)
        return rc;
    *bytes = (size_t)total_mem(d);
    return CUDA_SUCCESS;
}

/* The unversioned symbol keeps the pre-CUDA-3.2 ABI (unsigned int *): a caller must use _v2,
 * as cuda.h's #define does. Measured: values above 4 GiB - 1 read 0xFFFFFFFF. */
API CUresult cuDeviceTotalMem(unsigned *bytes, CUdevice dev)
{
    unsigned long long t;
    DEVICE(dev);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    t = total_mem(d);
    *bytes = t > UINT_MAX ? UINT_MAX : (unsigned)t;
    return CUDA_SUCCESS;
}

/* -------------------------------------------------------------- errors ---- */

struct cu_error {
    CUresult code;
    const char *name;
    const char *text;
};

static const struct cu_error errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system has unsupported display driver / cuda driver combination"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static const struct cu_error *find_error(CUresult error)
{
    size_t i;
    for (i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
        if (errors[i].code == error)
            return &errors[i];
    return NULL;
}

/* Both give CUDA_ERROR_INVALID_VALUE and a NULL string for a code the driver does not know. */
API CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    const struct cu_error *e = find_error(error);
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = e ? e->text : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    const struct cu_error *e = find_error(error);
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = e ? e->name : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
