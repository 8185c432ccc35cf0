/* Topology of the simulated GPU host, shared by the fake NVML and the fake CUDA driver.
 * Schema: see README.md. Everything here has hidden visibility (Makefile), so the two
 * libraries loaded into one process each keep their own copy. */
#ifndef FAKEGPU_TOPOLOGY_H
#define FAKEGPU_TOPOLOGY_H

#include <stddef.h>

#define FG_MAX_GPUS 64
#define FG_MAX_MIG 16
#define FG_MAX_PROCS 64
#define FG_UUID_LEN 40 /* "GPU-" + 36 chars */
#define FG_NAME_LEN 96
#define FG_VERSION_LEN 80
#define FG_MAX_XID 64

#define FG_DEFAULT_DRIVER_VERSION "580.159.04"
#define FG_DEFAULT_CUDA_VERSION 13000
/* Reported for gpuInstanceId/computeInstanceId of processes on a card not in MIG mode. */
#define FG_NO_INSTANCE 0xFFFFFFFFu
/* An optional reading the card does not give: the query answers NVML_ERROR_NOT_SUPPORTED. */
#define FG_UNSUPPORTED (-1LL)

struct fg_proc {
    unsigned pid;
    unsigned long long used_mib;
    int used_unknown; /* "used_memory_mib": null: NVML reports NVML_VALUE_NOT_AVAILABLE */
    unsigned gpu_instance_id;
    unsigned compute_instance_id;
    int graphics; /* "kind": "graphics": a graphics client (nvmlDeviceGetGraphicsRunningProcesses) */
};

/* A card's health as NVML reports it: from the topology, overlaid by the fault file ($FAKEGPU_FAULTS). */
struct fg_health {
    int lost;                        /* NVML_ERROR_GPU_IS_LOST from its handles */
    int ecc_supported;               /* "ecc": null -> 0: the ECC calls answer NOT_SUPPORTED */
    unsigned ecc_mode, ecc_pending_mode;
    unsigned long long ecc[2][2];    /* [0 corrected, 1 uncorrected][0 volatile, 1 aggregate], nvml.h's enums */
    int row_remapping;               /* 1: remapped rows answered, retired pages NOT_SUPPORTED; 0: the reverse */
    unsigned remap_corrected, remap_uncorrected, remap_pending, remap_failure;
    int retired_pages_pending;
    unsigned memory_query_error;     /* nvmlReturn_t of the ECC, retired-pages and remapped-rows calls, 0 = none */
    unsigned xid[FG_MAX_XID];        /* critical XIDs, each delivered once to every event set registered for them */
    int nxid;
};

struct fg_gpu;

struct fg_mig {
    char uuid[FG_UUID_LEN + 1];
    char name[FG_NAME_LEN];
    unsigned gpu_instance_id;
    unsigned compute_instance_id;
    unsigned long long memory_total_mib;
    unsigned long long memory_used_mib;
    int multiprocessor_count;
    struct fg_gpu *parent;
};

struct fg_gpu {
    char uuid[FG_UUID_LEN + 1];
    char name[FG_NAME_LEN];
    unsigned domain, bus, device, function;
    int cc_major, cc_minor;
    unsigned long long memory_total_mib;
    unsigned long long memory_used_mib;
    unsigned utilization_gpu, utilization_memory;
    long long temperature_c;                /* FG_UNSUPPORTED when absent */
    long long power_draw_mw, power_limit_mw; /* FG_UNSUPPORTED when absent */
    long long persistence_mode;              /* 1 (on, as a tuned host has it) when absent */
    unsigned pci_device_id, pci_subsystem_id;
    int multiprocessor_count;
    unsigned minor_number; /* position in the file's "gpus" array unless "minor_number" is given */
    struct fg_health health;
    unsigned mig_mode, mig_pending_mode;
    struct fg_mig mig[FG_MAX_MIG];
    int nmig;
    struct fg_proc procs[FG_MAX_PROCS];
    int nprocs;
};

struct fg_topology {
    char path[512];
    char driver_version[FG_VERSION_LEN];
    int cuda_driver_version;
    int nvml_init_fault;     /* nvmlReturn_t, 0 = none */
    int cuda_init_fault;     /* CUresult, 0 = none */
    int cuda_init_delay_ms;  /* cuInit answers only after this long (a hung driver), 0 = at once */
    struct fg_gpu gpus[FG_MAX_GPUS]; /* sorted by PCI bus id: NVML order */
    int ngpus;
};

enum fg_load_status {
    FG_LOAD_OK = 0,
    FG_LOAD_MISSING = 1,   /* no topology file: "no driver" */
    FG_LOAD_MALFORMED = 2, /* one line already printed to stderr */
};

/* Reads $FAKEGPU_TOPOLOGY (or /etc/fakegpu/topology.json when unset or empty) into *t. */
enum fg_load_status fg_topology_load(struct fg_topology *t);

/* The health of every card of t (in t's order) now: the topology's, overlaid by $FAKEGPU_FAULTS (re-read at
 * each call; absent variable or file: no faults), and the fault file's "nvml_init" (0 when none) in *nvml_init.
 * FG_LOAD_MALFORMED when the fault file is (one stderr line per process); live then holds the topology's. */
enum fg_load_status fg_faults_load(const struct fg_topology *t, struct fg_health live[FG_MAX_GPUS], int *nvml_init);

/* The processes that $FAKEGPU_PROCESSES gives the card g or its MIG devices (README.md), re-read on each call:
 * how many were written to out (at most max), 0 without the variable or the file, or minus the nvmlReturn_t that
 * the file gives the handle asked (the card's, or its MIG device `asked`), or -999 when the file is malformed (one
 * line on stderr). */
int fg_file_processes(const struct fg_gpu *g, const struct fg_mig *asked, struct fg_proc *out, int max);

/* Parses a PCI bus id as NVML accepts it (measured: sscanf-like hex fields, nothing after):
 *   domain:bus:device.function | domain:bus:device | bus:device.function
 * Returns 0 on success, -1 when the text is not a bus id. Values are not range-checked. */
int fg_parse_bus_id(const char *s, unsigned *domain, unsigned *bus, unsigned *device, unsigned *function);

/* Compares two GPUs by (domain, bus, device, function). */
int fg_bus_cmp(const struct fg_gpu *a, const struct fg_gpu *b);

/* Converts the 32 hex digits after "GPU-" / "MIG-" into 16 raw bytes. */
int fg_uuid_bytes(const char *uuid, unsigned char out[16]);

/* A spin lock over one byte, each library with its own: enough for init/shutdown, no libpthread needed. */
static inline void fg_lock(char *flag)
{
    while (__atomic_test_and_set(flag, __ATOMIC_ACQUIRE))
        ;
}

static inline void fg_unlock(char *flag)
{
    __atomic_clear(flag, __ATOMIC_RELEASE);
}

#endif
