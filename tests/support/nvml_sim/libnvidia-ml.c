/*
 * libnvidia-ml.so.1 for the test suite: NVML's C ABI over a simulated pool of cards.
 *
 * NVML is the one edge of the package we do not own, and the machines the tests run on have no
 * NVIDIA driver. This library stands where the driver's libnvidia-ml.so.1 stands, so that the
 * real consumers run unmodified above it: the `pynvml` bindings (nvidia-ml-py) our inventory and
 * usage sampling call, and NVIDIA's k8s-device-plugin (go-nvml, which dlopen()s
 * "libnvidia-ml.so.1" and resolves entry points lazily, preferring the versioned ones: nvmlInit_v2,
 * nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetPciInfo_v3,
 * nvmlDeviceGetComputeRunningProcesses_v3, nvmlEventSetWait_v2). The structures below are laid
 * out as NVML 12's nvml.h lays them out; only what those consumers read is declared.
 *
 * The state: ONE file, named by the environment variable GPUSHARE_NVML_STATE, that the rest of
 * the simulation writes (tests/support/nvml_sim/state.py; it writes a temporary file and renames
 * it over the old one, so a reader never sees half a file). Every entry point stats the file and
 * parses it again when it changed (device, inode, size or mtime), so a process keeps its handles
 * and still sees what a test wrote a moment ago. Without the variable, without the file, or with
 * a malformed file (its line named once on stderr), nvmlInit and every later call answer
 * NVML_ERROR_DRIVER_NOT_LOADED, as on a machine without the driver.
 *
 * What a container sees: where NVIDIA_VISIBLE_DEVICES is set in the calling process, the library
 * serves only the cards it names, as NVIDIA's container toolkit would have given a container only
 * those devices (its OCI runtime wrapper mounts the driver's library and the named /dev/nvidia*
 * nodes; tests/cluster/nvidia_runtime.py is its stand-in on the test cluster's real node). The
 * value is a comma-separated list of card UUIDs or indexes in the state's order ("all": every
 * card); "none", "void" or an empty value is a container with the driver and no device (nvmlInit
 * succeeds, the count is 0). The cards shown are indexed from 0 in the list's order, exactly as a
 * container sees its devices; their processes, samples and Xid errors stay theirs, the other
 * cards' are gone. A name that is no card of the state is said on stderr and there is no driver
 * (the toolkit refuses to create such a container). Unset: every card, the host's view (NVIDIA's
 * device plugin runs without the variable). Processes keep the host's PIDs, as the real driver
 * reports them inside a container (NVIDIA/nvidia-docker#1483).
 *
 * Format: UTF-8 text, one record per line, fields separated by one TAB (names contain spaces,
 * never tabs), "-" for a value the driver does not report. Lines starting with '#' and empty
 * lines are ignored. The first record must be the format's version:
 *
 *   nvml-sim	1
 *   driver	<driver version, e.g. 550.54.15>
 *   cuda	<CUDA driver version as NVML encodes it, 1000*major + 10*minor, e.g. 12040>
 *   gpu	<uuid>	<name>	<memory total B>	<reserved B>	<used B>	<utilization % | ->
 *   	<PCI bus id, e.g. 00000000:3B:00.0>	<PCI device id, e.g. 0x233510DE>	<minor>	<cc, e.g. 9.0>
 *   process	<gpu uuid>	<pid>	<used B | ->
 *   sample	<gpu uuid>	<pid>	<timestamp µs>	<SM %>	<memory %>
 *   xid	<gpu uuid>	<Xid code>
 *
 * (a gpu record is one line; it is wrapped above only to fit). Cards are indexed in the order of
 * their gpu records. "reserved" is what the driver and firmware keep: nvmlDeviceGetMemoryInfo
 * (version 1) counts it used, nvmlDeviceGetMemoryInfo_v2 reports it apart. "process" records are
 * the card's compute processes; "sample" records are the per-process utilisation samples
 * nvmlDeviceGetProcessUtilization answers (those newer than the timestamp asked); a card whose
 * utilisation is "-" answers NOT_SUPPORTED for both. "xid" records are critical Xid errors in the
 * order they happened: an event set registered for that card's Xid events returns each once, so a
 * test can make NVIDIA's device plugin mark a card unhealthy.
 *
 * Topology: every two cards are NVML_TOPOLOGY_SYSTEM apart (no PCIe switch or NVLink between them).
 * Not simulated: MIG (mode is reported off: MIG-capable boards with MIG disabled answer that way),
 * NVLink, P2P, clocks, power, temperatures, ECC counters, vGPU, accounting, GPM, and
 * every setter: they answer NVML_ERROR_NOT_SUPPORTED (or NOT_FOUND for lookups), as a real
 * driver does on a board without the feature. An entry point that is not defined here at all
 * makes pynvml raise FunctionNotFound and go-nvml's process stop with "symbol lookup error".
 */

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_VALUE_NOT_AVAILABLE_ULL (~0ULL)
#define NVML_EVENT_TYPE_XID_CRITICAL_ERROR 0x0000000000000008ULL
#define NVML_STRUCT_VERSION(size, version) ((unsigned int)(size) | ((unsigned int)(version) << 24U))
#define NVML_DEVICE_MIG_DISABLE 0
#define NVML_BRAND_NVIDIA 14

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 NVML_STRUCT_VERSION(sizeof(nvmlMemory_v2_t), 2)

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct { /* nvmlPciInfo_t since NVML 2.285: what _v2 and _v3 fill */
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { /* the first version's layout, for nvmlDeviceGetPciInfo */
    char busId[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    unsigned int reserved0, reserved1, reserved2, reserved3;
} nvmlPciInfo_v1_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct { /* _v2 and _v3 */
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

#define MAX_GPUS 64
#define MAX_RECORDS 1024
#define TEXT 96

struct gpu {
    char uuid[TEXT], name[TEXT], bus_id[32];
    unsigned long long total, reserved, used;
    int utilization; /* -1: not supported */
    unsigned int pci_device_id, minor, domain, bus, device;
    int cc_major, cc_minor;
};
typedef struct gpu *nvmlDevice_t;

struct process {
    int gpu;
    unsigned int pid;
    unsigned long long used;
};

struct sample {
    int gpu;
    unsigned int pid, sm, mem;
    unsigned long long timestamp;
};

struct xid {
    int gpu;
    unsigned long long code;
};

struct state {
    char driver[81];
    int cuda;
    int gpu_count, process_count, sample_count, xid_count;
    struct gpu gpus[MAX_GPUS];
    struct process processes[MAX_RECORDS];
    struct sample samples[MAX_RECORDS];
    struct xid xids[MAX_RECORDS];
};

/* Handles point into `gpus`, which never moves: a handle stays valid across reloads while its
 * index is below the current count (a card that left the file answers GPU_IS_LOST). */
static struct gpu gpus[MAX_GPUS];
static struct state current, parsing;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;   /* nvmlInit calls not yet matched by nvmlShutdown */
static int loaded;        /* `current` holds the state file as it is now */

static void complain(const char *path, int line, const char *what) {
    fprintf(stderr, "libnvidia-ml.so.1 (simulated): %s:%d: %s\n", path, line, what);
}

static int split(char *line, char **fields, int most) {
    int count = 0;
    char *cursor = line;
    while (count < most) {
        fields[count++] = cursor;
        char *tab = strchr(cursor, '\t');
        if (tab == NULL) break;
        *tab = '\0';
        cursor = tab + 1;
    }
    return count;
}

static int number(const char *text, unsigned long long *value) {
    char *end;
    errno = 0;
    *value = strtoull(text, &end, 0);
    return errno == 0 && end != text && *end == '\0';
}

static int copy_text(char *target, size_t size, const char *text) {
    if (strlen(text) >= size) return 0;
    strcpy(target, text);
    return 1;
}

static int find_gpu(const struct state *s, const char *uuid) {
    for (int i = 0; i < s->gpu_count; i++)
        if (strcmp(s->gpus[i].uuid, uuid) == 0) return i;
    return -1;
}

static int parse_gpu(struct gpu *g, char **f) {
    unsigned long long value;
    if (!copy_text(g->uuid, sizeof g->uuid, f[1]) || !copy_text(g->name, sizeof g->name, f[2]))
        return 0;
    if (!number(f[3], &g->total) || !number(f[4], &g->reserved) || !number(f[5], &g->used))
        return 0;
    if (strcmp(f[6], "-") == 0) g->utilization = -1;
    else if (number(f[6], &value) && value <= 100) g->utilization = (int)value;
    else return 0;
    if (!copy_text(g->bus_id, sizeof g->bus_id, f[7])) return 0;
    if (sscanf(g->bus_id, "%x:%x:%x.", &g->domain, &g->bus, &g->device) != 3) return 0;
    if (!number(f[8], &value)) return 0;
    g->pci_device_id = (unsigned int)value;
    if (!number(f[9], &value)) return 0;
    g->minor = (unsigned int)value;
    return sscanf(f[10], "%d.%d", &g->cc_major, &g->cc_minor) == 2;
}

/* Parses `path` into `parsing`; 0 and a message on stderr when it is not a state file. */
static int parse(const char *path) {
    FILE *file = fopen(path, "r");
    if (file == NULL) return 0;
    struct state *s = &parsing;
    memset(s, 0, sizeof *s);
    char line[1024];
    char *f[12];
    int number_of_line = 0, ok = 1, versioned = 0;
    unsigned long long value = 0;
    while (ok && fgets(line, sizeof line, file) != NULL) {
        number_of_line++;
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '\0' || line[0] == '#') continue;
        int n = split(line, f, 12);
        if (!versioned) {
            ok = versioned = n == 2 && strcmp(f[0], "nvml-sim") == 0 && strcmp(f[1], "1") == 0;
            if (!ok) complain(path, number_of_line, "the first record is not \"nvml-sim<TAB>1\"");
            continue;
        }
        if (strcmp(f[0], "driver") == 0 && n == 2) {
            ok = copy_text(s->driver, sizeof s->driver, f[1]);
        } else if (strcmp(f[0], "cuda") == 0 && n == 2) {
            ok = number(f[1], &value);
            s->cuda = (int)value;
        } else if (strcmp(f[0], "gpu") == 0 && n == 11) {
            ok = s->gpu_count < MAX_GPUS && parse_gpu(&s->gpus[s->gpu_count], f)
                 && find_gpu(s, f[1]) < 0;
            s->gpu_count++;
        } else if (strcmp(f[0], "process") == 0 && n == 4 && s->process_count < MAX_RECORDS) {
            struct process *p = &s->processes[s->process_count++];
            p->gpu = find_gpu(s, f[1]);
            ok = p->gpu >= 0 && number(f[2], &value);
            p->pid = (unsigned int)value;
            if (strcmp(f[3], "-") == 0) p->used = NVML_VALUE_NOT_AVAILABLE_ULL;
            else ok = ok && number(f[3], &p->used);
        } else if (strcmp(f[0], "sample") == 0 && n == 6 && s->sample_count < MAX_RECORDS) {
            struct sample *p = &s->samples[s->sample_count++];
            p->gpu = find_gpu(s, f[1]);
            ok = p->gpu >= 0 && number(f[2], &value);
            p->pid = (unsigned int)value;
            ok = ok && number(f[3], &p->timestamp) && number(f[4], &value);
            p->sm = (unsigned int)value;
            ok = ok && number(f[5], &value);
            p->mem = (unsigned int)value;
        } else if (strcmp(f[0], "xid") == 0 && n == 3 && s->xid_count < MAX_RECORDS) {
            struct xid *x = &s->xids[s->xid_count++];
            x->gpu = find_gpu(s, f[1]);
            ok = x->gpu >= 0 && number(f[2], &x->code);
        } else {
            ok = 0;
        }
        if (!ok) complain(path, number_of_line, "not a record of the nvml-sim 1 format");
    }
    fclose(file);
    if (ok && !versioned) complain(path, number_of_line, "empty: no \"nvml-sim<TAB>1\" record");
    return ok && versioned;
}

/* Keeps only the cards NVIDIA_VISIBLE_DEVICES names (`visible`; NULL: the variable is unset),
 * in its order and indexed from 0, with their records: what a container the toolkit gave those
 * devices sees. A name that is no card of the state is said on stderr and there is no driver (the
 * toolkit refuses to create such a container: "unknown device"). */
static int select_visible(struct state *s, const char *visible, const char *path) {
    static struct gpu shown[MAX_GPUS];
    int position[MAX_GPUS], keep[MAX_GPUS], kept = 0;
    if (visible == NULL || strcmp(visible, "all") == 0) return 1;
    if (visible[0] != '\0' && strcmp(visible, "none") != 0 && strcmp(visible, "void") != 0) {
        char list[4096], *save = NULL;
        if (!copy_text(list, sizeof list, visible)) {
            fprintf(stderr, "libnvidia-ml.so.1 (simulated): NVIDIA_VISIBLE_DEVICES is too long\n");
            return 0;
        }
        for (char *name = strtok_r(list, ",", &save); name != NULL; name = strtok_r(NULL, ",", &save)) {
            unsigned long long value;
            int index = find_gpu(s, name);
            if (index < 0 && number(name, &value) && value < (unsigned long long)s->gpu_count) index = (int)value;
            if (index < 0) {
                fprintf(stderr, "libnvidia-ml.so.1 (simulated): NVIDIA_VISIBLE_DEVICES names \"%s\", "
                        "which is neither the UUID nor the index of a card of %s\n", name, path);
                return 0;
            }
            int listed = 0;
            for (int j = 0; j < kept; j++) listed |= keep[j] == index;
            if (!listed) keep[kept++] = index;
        }
    }
    for (int i = 0; i < MAX_GPUS; i++) position[i] = -1;
    for (int j = 0; j < kept; j++) {
        position[keep[j]] = j;
        shown[j] = s->gpus[keep[j]];
    }
    memcpy(s->gpus, shown, sizeof shown);
    s->gpu_count = kept;
    /* The records of the cards left keep their order and point at the cards' new indexes. */
    int n = 0;
    for (int i = 0; i < s->process_count; i++)
        if (position[s->processes[i].gpu] >= 0) {
            s->processes[n] = s->processes[i];
            s->processes[n++].gpu = position[s->processes[i].gpu];
        }
    s->process_count = n;
    n = 0;
    for (int i = 0; i < s->sample_count; i++)
        if (position[s->samples[i].gpu] >= 0) {
            s->samples[n] = s->samples[i];
            s->samples[n++].gpu = position[s->samples[i].gpu];
        }
    s->sample_count = n;
    n = 0;
    for (int i = 0; i < s->xid_count; i++)
        if (position[s->xids[i].gpu] >= 0) {
            s->xids[n] = s->xids[i];
            s->xids[n++].gpu = position[s->xids[i].gpu];
        }
    s->xid_count = n;
    return 1;
}

/* Brings `current` up to date with the file; the caller holds `lock`. Returns whether a state is
 * loaded: without the file, or with a malformed one (said once on stderr), there is no driver. */
static int refresh(void) {
    static struct stat seen; /* the version of the file last parsed, good or not */
    static char seen_path[4096], seen_visible[4098];
    const char *path = getenv("GPUSHARE_NVML_STATE");
    const char *visible = getenv("NVIDIA_VISIBLE_DEVICES");
    char visible_now[4098]; /* "=" and the value, or "-" for unset: the view parsed for */
    struct stat now;
    if (path == NULL || stat(path, &now) != 0) {
        loaded = 0;
        seen_path[0] = '\0';
        return 0;
    }
    snprintf(visible_now, sizeof visible_now, "%s%s", visible == NULL ? "-" : "=", visible == NULL ? "" : visible);
    if (strcmp(path, seen_path) == 0 && strcmp(visible_now, seen_visible) == 0 && now.st_dev == seen.st_dev
        && now.st_ino == seen.st_ino && now.st_size == seen.st_size && now.st_mtim.tv_sec == seen.st_mtim.tv_sec
        && now.st_mtim.tv_nsec == seen.st_mtim.tv_nsec)
        return loaded;
    seen = now;
    snprintf(seen_path, sizeof seen_path, "%s", path);
    snprintf(seen_visible, sizeof seen_visible, "%s", visible_now);
    loaded = parse(path) && select_visible(&parsing, visible, path);
    if (loaded) {
        current = parsing;
        memcpy(gpus, current.gpus, sizeof gpus);
    }
    return loaded;
}

/* Every device entry point starts here: the lock taken, the state fresh, the handle checked. */
static nvmlReturn_t enter(void) {
    pthread_mutex_lock(&lock);
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!refresh()) return NVML_ERROR_DRIVER_NOT_LOADED;
    return NVML_SUCCESS;
}

/* For the calls NVML answers before nvmlInit (the versions): the lock and the state only. */
static nvmlReturn_t enter_any_time(void) {
    pthread_mutex_lock(&lock);
    return refresh() ? NVML_SUCCESS : NVML_ERROR_DRIVER_NOT_LOADED;
}

static nvmlReturn_t enter_device(nvmlDevice_t device) {
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS) return ret;
    if (device == NULL || device < gpus || device >= gpus + MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    if (device - gpus >= current.gpu_count) return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

static nvmlReturn_t leave(nvmlReturn_t ret) {
    pthread_mutex_unlock(&lock);
    return ret;
}

static nvmlReturn_t put_text(char *target, unsigned int length, const char *text) {
    if (target == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(target, text);
    return NVML_SUCCESS;
}

/* ---- initialisation ---- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    if (!refresh()) return leave(NVML_ERROR_DRIVER_NOT_LOADED);
    initialized++;
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    if (!initialized) return leave(NVML_ERROR_UNINITIALIZED);
    initialized--;
    return leave(NVML_SUCCESS);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

/* ---- system ---- */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS) return leave(ret);
    return leave(put_text(version, length, current.driver));
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    nvmlReturn_t ret = enter_any_time();
    if (ret != NVML_SUCCESS) return leave(ret);
    char text[96];
    snprintf(text, sizeof text, "%d.%s", current.cuda / 1000, current.driver); /* "12.550.54.15" */
    return leave(put_text(version, length, text));
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    nvmlReturn_t ret = enter_any_time();
    if (ret != NVML_SUCCESS) return leave(ret);
    if (version == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *version = current.cuda;
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    return nvmlSystemGetCudaDriverVersion_v2(version);
}

/* ---- finding devices ---- */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS) return leave(ret);
    if (count == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned int)current.gpu_count;
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS) return leave(ret);
    if (device == NULL || index >= (unsigned int)current.gpu_count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = &gpus[index];
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS) return leave(ret);
    if (uuid == NULL || device == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    int index = find_gpu(&current, uuid);
    if (index < 0) return leave(NVML_ERROR_NOT_FOUND);
    *device = &gpus[index];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS) return leave(ret);
    if (bus_id == NULL || device == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int domain, bus, slot;
    if (sscanf(bus_id, "%x:%x:%x.", &domain, &bus, &slot) != 3) return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < current.gpu_count; i++) {
        if (gpus[i].domain == domain && gpus[i].bus == bus && gpus[i].device == slot) {
            *device = &gpus[i];
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device) {
    (void)serial, (void)device;
    return NVML_ERROR_NOT_FOUND; /* the simulated boards have no serial numbers */
}

/* ---- identity ---- */

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    if (index == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned int)(device - gpus);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    return leave(put_text(name, length, device->name));
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    return leave(put_text(uuid, length, device->uuid));
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    (void)serial, (void)length;
    nvmlReturn_t ret = enter_device(device);
    return leave(ret != NVML_SUCCESS ? ret : NVML_ERROR_NOT_SUPPORTED);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    if (minor == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *minor = device->minor;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, int *brand) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    if (brand == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *brand = NVML_BRAND_NVIDIA;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    if (major == NULL || minor == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *major = device->cc_major;
    *minor = device->cc_minor;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *architecture) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    if (architecture == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    /* nvmlDeviceArchitecture_t from the compute capability: Volta 5, Turing 6, Ampere 7,
     * Ada 8, Hopper 9, Blackwell 10 (nvml.h's NVML_DEVICE_ARCH_*) */
    int cc = device->cc_major * 10 + device->cc_minor;
    *architecture = cc >= 100 ? 10 : cc >= 90 ? 9 : cc >= 89 ? 8 : cc >= 80 ? 7 : cc >= 75 ? 6 : 5;
    return leave(NVML_SUCCESS);
}

static void fill_pci(const struct gpu *g, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.0", g->domain & 0xffff, g->bus, g->device);
    snprintf(pci->busId, sizeof pci->busId, "%s", g->bus_id);
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->device;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_device_id; /* what many boards answer: subsystem = device */
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    if (pci == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    fill_pci(device, pci);
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_v1_t *pci) {
    nvmlPciInfo_t full;
    if (pci == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = nvmlDeviceGetPciInfo_v3(device, &full);
    if (ret != NVML_SUCCESS) return ret;
    memset(pci, 0, sizeof *pci);
    memcpy(pci->busId, full.busIdLegacy, sizeof pci->busId);
    pci->domain = full.domain;
    pci->bus = full.bus;
    pci->device = full.device;
    pci->pciDeviceId = full.pciDeviceId;
    pci->pciSubSystemId = full.pciSubSystemId;
    return NVML_SUCCESS;
}

/* ---- memory and utilisation ---- */

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    if (memory == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    memory->total = device->total;
    memory->used = device->used + device->reserved; /* version 1 counts the reserve used */
    memory->free = memory->used > device->total ? 0 : device->total - memory->used;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    if (memory == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != nvmlMemory_v2) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned long long taken = device->used + device->reserved;
    memory->total = device->total;
    memory->reserved = device->reserved;
    memory->used = device->used;
    memory->free = taken > device->total ? 0 : device->total - taken;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    if (utilization == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (device->utilization < 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    utilization->gpu = (unsigned int)device->utilization;
    utilization->memory = 0;
    return leave(NVML_SUCCESS);
}

/* ---- processes ---- */

/* NVML's two-call protocol: a count too small (or no array) answers INSUFFICIENT_SIZE with the
 * count needed; no process answers SUCCESS and 0. `wide` selects the _v2/_v3 record. */
static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *count, void *infos, int wide) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    if (count == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    int index = (int)(device - gpus);
    unsigned int found = 0;
    for (int i = 0; i < current.process_count; i++) found += current.processes[i].gpu == index;
    if (found > *count || (found > 0 && infos == NULL)) {
        *count = found;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned int written = 0;
    for (int i = 0; i < current.process_count; i++) {
        const struct process *p = &current.processes[i];
        if (p->gpu != index) continue;
        if (wide) {
            nvmlProcessInfo_t *info = (nvmlProcessInfo_t *)infos + written;
            info->pid = p->pid;
            info->usedGpuMemory = p->used;
            info->gpuInstanceId = info->computeInstanceId = 0xFFFFFFFF; /* no MIG */
        } else {
            nvmlProcessInfo_v1_t *info = (nvmlProcessInfo_v1_t *)infos + written;
            info->pid = p->pid;
            info->usedGpuMemory = p->used;
        }
        written++;
    }
    *count = written;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_t *p) {
    return processes(d, n, p, 1);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_t *p) {
    return processes(d, n, p, 1);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_v1_t *p) {
    return processes(d, n, p, 0);
}

/* No graphics or MPS clients on a simulated card. */
static nvmlReturn_t no_processes(nvmlDevice_t device, unsigned int *count) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    if (count == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = 0;
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *n, void *p) {
    (void)p;
    return no_processes(d, n);
}
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *n, void *p) {
    (void)p;
    return no_processes(d, n);
}
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *n, void *p) {
    (void)p;
    return no_processes(d, n);
}
EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *n, void *p) {
    (void)p;
    return no_processes(d, n);
}
EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *n, void *p) {
    (void)p;
    return no_processes(d, n);
}
EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t d, unsigned int *n, void *p) {
    (void)p;
    return no_processes(d, n);
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *samples,
                                                    unsigned int *count, unsigned long long last_seen) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    if (count == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (device->utilization < 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    int index = (int)(device - gpus);
    unsigned int found = 0;
    for (int i = 0; i < current.sample_count; i++)
        found += current.samples[i].gpu == index && current.samples[i].timestamp > last_seen;
    if (found == 0) return leave(NVML_ERROR_NOT_FOUND); /* no sample newer than last_seen */
    if (samples == NULL || found > *count) {
        *count = found;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned int written = 0;
    for (int i = 0; i < current.sample_count; i++) {
        const struct sample *s = &current.samples[i];
        if (s->gpu != index || s->timestamp <= last_seen) continue;
        nvmlProcessUtilizationSample_t *out = &samples[written++];
        memset(out, 0, sizeof *out);
        out->pid = s->pid;
        out->timeStamp = s->timestamp;
        out->smUtil = s->sm;
        out->memUtil = s->mem;
    }
    *count = written;
    return leave(NVML_SUCCESS);
}

/* ---- MIG: every simulated board is MIG-capable with MIG disabled ---- */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current_mode, unsigned int *pending) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    if (current_mode == NULL || pending == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *current_mode = *pending = NVML_DEVICE_MIG_DISABLE;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    if (count == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = 0;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig) {
    (void)index, (void)mig;
    nvmlReturn_t ret = enter_device(device);
    return leave(ret != NVML_SUCCESS ? ret : NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    if (is_mig == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *is_mig = 0;
    return leave(NVML_SUCCESS);
}

/* A full GPU is not a MIG device: it has no parent (an invalid MIG handle), and no GPU or
 * compute instance (a query the device does not support). */
EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t *device) {
    (void)device;
    nvmlReturn_t ret = enter_device(mig);
    return leave(ret != NVML_SUCCESS ? ret : NVML_ERROR_INVALID_ARGUMENT);
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    (void)id;
    nvmlReturn_t ret = enter_device(device);
    return leave(ret != NVML_SUCCESS ? ret : NVML_ERROR_NOT_SUPPORTED);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    (void)id;
    nvmlReturn_t ret = enter_device(device);
    return leave(ret != NVML_SUCCESS ? ret : NVML_ERROR_NOT_SUPPORTED);
}

/* ---- events: Xid critical errors from the state's "xid" records ---- */

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

struct event_set {
    int registered[MAX_GPUS]; /* which cards' Xid events this set receives */
    int delivered;            /* xid records already looked at */
};
typedef struct event_set *nvmlEventSet_t;

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS) return leave(ret);
    if (set == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *set = calloc(1, sizeof **set);
    if (*set == NULL) return leave(NVML_ERROR_UNKNOWN);
    (*set)->delivered = current.xid_count; /* an event set sees what happens after it exists */
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    free(set);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    if (types == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *types = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    nvmlReturn_t ret = enter_device(device);
    if (ret != NVML_SUCCESS) return leave(ret);
    if (set == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (types & ~NVML_EVENT_TYPE_XID_CRITICAL_ERROR) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (types) set->registered[device - gpus] = 1;
    return leave(NVML_SUCCESS);
}

/* Waits up to `timeout` ms for the next xid record of a registered card, polling the file. */
EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout) {
    if (set == NULL || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    const struct timespec pause = {0, 50 * 1000 * 1000};
    for (unsigned int waited = 0;; waited += 50) {
        nvmlReturn_t ret = enter();
        if (ret != NVML_SUCCESS) return leave(ret);
        if (set->delivered > current.xid_count) set->delivered = current.xid_count; /* a new pool */
        while (set->delivered < current.xid_count) {
            const struct xid *x = &current.xids[set->delivered++];
            if (!set->registered[x->gpu]) continue;
            memset(data, 0, sizeof *data);
            data->device = &gpus[x->gpu];
            data->eventType = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
            data->eventData = x->code;
            data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFF;
            return leave(NVML_SUCCESS);
        }
        leave(NVML_SUCCESS);
        if (waited >= timeout) return NVML_ERROR_TIMEOUT;
        nanosleep(&pause, NULL);
    }
}
EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout) {
    return nvmlEventSetWait_v2(set, data, timeout);
}

/* ---- topology: every two cards are a system apart (no shared PCIe switch, no NVLink) ---- */

#define NVML_TOPOLOGY_INTERNAL 0
#define NVML_TOPOLOGY_SYSTEM 50

/* NVIDIA's device plugin asks this of every pair of cards to choose whole cards for a container
 * (GetPreferredAllocation, through go-gpuallocator): without an answer, the kubelet's request fails. */
EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device, nvmlDevice_t other, int *level) {
    nvmlReturn_t ret = enter_device(device);
    if (ret == NVML_SUCCESS && (other == NULL || other < gpus || other - gpus >= current.gpu_count))
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret != NVML_SUCCESS) return leave(ret);
    if (level == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *level = device == other ? NVML_TOPOLOGY_INTERNAL : NVML_TOPOLOGY_SYSTEM;
    return leave(NVML_SUCCESS);
}

/* ---- what a simulated board does not have ---- */

#pragma GCC diagnostic ignored "-Wunused-parameter" /* the arguments of what is not supported */

#define NOT_SUPPORTED(name, ...)                                       \
    EXPORT nvmlReturn_t name(nvmlDevice_t device, __VA_ARGS__) {       \
        nvmlReturn_t ret = enter_device(device);                       \
        return leave(ret != NVML_SUCCESS ? ret : NVML_ERROR_NOT_SUPPORTED); \
    }

NOT_SUPPORTED(nvmlDeviceGetAttributes_v2, void *attributes)
NOT_SUPPORTED(nvmlDeviceGetAttributes, void *attributes)
NOT_SUPPORTED(nvmlDeviceGetP2PStatus, nvmlDevice_t other, int index, int *status)
NOT_SUPPORTED(nvmlDeviceGetNvLinkState, unsigned int link, int *active)
NOT_SUPPORTED(nvmlDeviceGetNvLinkRemotePciInfo_v2, unsigned int link, nvmlPciInfo_t *pci)
NOT_SUPPORTED(nvmlDeviceGetCpuAffinity, unsigned int size, unsigned long *set)
NOT_SUPPORTED(nvmlDeviceGetNumaNodeId, unsigned int *node)
NOT_SUPPORTED(nvmlDeviceGetPowerUsage, unsigned int *power)
NOT_SUPPORTED(nvmlDeviceGetTemperature, int sensor, unsigned int *temperature)
NOT_SUPPORTED(nvmlDeviceGetBoardPartNumber, char *part, unsigned int length)
NOT_SUPPORTED(nvmlDeviceGetVbiosVersion, char *version, unsigned int length)
NOT_SUPPORTED(nvmlDeviceGetDriverModel_v2, int *current_model, int *pending)
NOT_SUPPORTED(nvmlDeviceGetDriverModel, int *current_model, int *pending)
NOT_SUPPORTED(nvmlDeviceGetGpuFabricInfo, void *info)
NOT_SUPPORTED(nvmlDeviceGetGpuFabricInfoV, void *info)
NOT_SUPPORTED(nvmlDeviceGetEncoderUtilization, unsigned int *utilization, unsigned int *period)
NOT_SUPPORTED(nvmlDeviceGetDecoderUtilization, unsigned int *utilization, unsigned int *period)
NOT_SUPPORTED(nvmlDeviceGetProcessesUtilizationInfo, void *info)
