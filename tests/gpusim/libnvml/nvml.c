/*
 * gpusim's libnvidia-ml.so.1: the NVML entry points that gpuops.nvidia calls, answered from
 * the simulated host's state so the real nvidia-ml-py bindings run end to end.
 *
 * State: ROOT/var/lib/gpusim/state.nvml and procs/<pid>.nvml, flat twins of the JSON files
 * that gpusim writes together with them (gpusim/state.py, flat_text). Memory is computed as
 * the fake nvidia-smi does (gpusim/state.py, gpu_usage): live holders (checked in /proc,
 * with their start time) + dead ones inside the release delay + leaked ones until a reset
 * + stuck memory + the idle reading. Faults: lost GPUs, hang, N/A fields (as NVML return
 * codes), driver not loaded, version mismatch, no devices, row remapping and page retirement.
 *
 * Memory as real drivers report it: v1 nvmlDeviceGetMemoryInfo's `used` is reserved plus
 * allocated (NVML docs: "Sum of Reserved and Allocated"; real-samples Q09: idle GPUs read
 * hundreds of MiB); v2's `used` is allocated only, as nvidia-smi's memory.used, with
 * `reserved` beside it. In both, free = total - reserved - allocated.
 *
 * Older drivers' libraries (built with -D): GPUSIM_NO_MEMORY_V2 leaves out
 * nvmlDeviceGetMemoryInfo_v2, GPUSIM_NO_PROCESSES_V3 / _V2 the versioned process calls; the
 * symbol is then missing, as pynvml meets it on such a host (dlsym fails).
 *
 * ROOT: $GPUSIM_ROOT, else the directory above the one this library lies in, else "/".
 * Build: gcc -shared -fPIC -o libnvidia-ml.so.1 nvml.c (gpusim/nvml_build.py does it).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_RESET_REQUIRED 16
#define NVML_ERROR_LIB_RM_VERSION_MISMATCH 18
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

#define MAX_GPUS 64
#define MAX_NA 256
#define MAX_RECS 1024
#define MIB (1024ULL * 1024ULL)
#define NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFULL
#define NOT_AVAILABLE_UINT 0xFFFFFFFFU

typedef struct {
    int index;
    int has_minor, minor;     /* the driver's minor number ("minor" lines); else the index */
    long long total_mib;
    int persistence;
    int compute_mode;
    int temperature;
    long long stuck_mib;
    long long idle_mib;       /* what an idle GPU reads as used (v2, nvidia-smi) */
    long long reserved_mib;   /* reserved by driver and firmware: in v1 used, not in v2 used */
    int lost;                 /* 0, or the NVML code every query but PCI info returns */
    unsigned remap_corr, remap_unc, remap_pending, remap_failure;
    int retired_pending;      /* -1: not supported */
    int recovery;             /* the driver's GPU Recovery Action; -1: no such field (before 565) */
    char bus_id[32];
    char uuid[96];
    char name[96];
} sim_gpu;

typedef struct {
    char field[64];
    int gpu;                  /* -1: every GPU */
    int code;
} sim_na;

typedef struct {
    long pid;
    long long starttime;      /* -1: unknown */
    double created;
    long long mib;
    int util;
    int leak;
    double died_at;           /* -1: not recorded yet */
    int gpus[MAX_GPUS];
    int ngpus;
    int reset[MAX_GPUS];
    int nreset;
    char name[256];
    int alive;
} sim_rec;

typedef struct {
    char driver[80];
    double release_delay;
    double hang;
    int driver_not_loaded, no_devices, mismatch;
    sim_gpu gpus[MAX_GPUS];
    int ngpus;
    sim_na na[MAX_NA];
    int nna;
} sim_state;

/* A device handle points at one of these; only the index matters. */
struct nvmlDevice_st { unsigned index; };
typedef struct nvmlDevice_st *nvmlDevice_t;
static struct nvmlDevice_st handles[MAX_GPUS];

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define NVML_MEMORY_V2 ((unsigned)(sizeof(nvmlMemory_v2_t) | (2 << 24)))
typedef struct { unsigned gpu, memory; } nvmlUtilization_t;
typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
    unsigned gpuInstanceId;
    unsigned computeInstanceId;
} nvmlProcessInfo_t;
/* What the unversioned nvmlDeviceGetComputeRunningProcesses fills (nvmlProcessInfo_v1_t). */
typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

static int init_count;
static char root_dir[PATH_MAX];

/* ------------------------------------------------------------------ state files */

static void find_root(void)
{
    const char *env = getenv("GPUSIM_ROOT");
    char probe[PATH_MAX + 64];
    Dl_info info;

    if (env && *env) {
        snprintf(root_dir, sizeof root_dir, "%s", env);
        return;
    }
    if (dladdr((void *)find_root, &info) && info.dli_fname) {
        char lib[PATH_MAX];
        if (realpath(info.dli_fname, lib)) {
            char *slash = strrchr(lib, '/');
            if (slash) {
                *slash = '\0';
                slash = strrchr(lib, '/');
                if (slash) {
                    *slash = '\0';
                    snprintf(probe, sizeof probe, "%s/var/lib/gpusim/state.nvml", lib);
                    if (access(probe, R_OK) == 0) {
                        snprintf(root_dir, sizeof root_dir, "%s", lib);
                        return;
                    }
                }
            }
        }
    }
    snprintf(root_dir, sizeof root_dir, "%s", "");
}

/* Copies src into dst, cut to fit. */
static void set_str(char *dst, size_t size, const char *src)
{
    size_t n = strlen(src);
    if (n >= size) n = size - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static char *rest_of(char *line, int skip_words)
{
    while (skip_words-- > 0) {
        while (*line && *line != ' ') line++;
        while (*line == ' ') line++;
    }
    line[strcspn(line, "\n")] = '\0';
    return line;
}

/* Returns 0, or an NVML code when there is no simulated host (no driver). */
static int load_state(sim_state *st)
{
    char path[PATH_MAX + 64], line[1024];
    FILE *f;

    memset(st, 0, sizeof *st);
    snprintf(path, sizeof path, "%s/var/lib/gpusim/state.nvml", root_dir);
    f = fopen(path, "r");
    if (!f) return NVML_ERROR_DRIVER_NOT_LOADED;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "driver ", 7) == 0) {
            set_str(st->driver, sizeof st->driver, rest_of(line, 1));
        } else if (sscanf(line, "release_delay %lf", &st->release_delay) == 1) {
        } else if (sscanf(line, "hang %lf", &st->hang) == 1) {
        } else if (sscanf(line, "driver_not_loaded %d", &st->driver_not_loaded) == 1) {
        } else if (sscanf(line, "no_devices %d", &st->no_devices) == 1) {
        } else if (sscanf(line, "mismatch %d", &st->mismatch) == 1) {
        } else if (strncmp(line, "gpu ", 4) == 0 && st->ngpus < MAX_GPUS) {
            sim_gpu *g = &st->gpus[st->ngpus];
            if (sscanf(line, "gpu %d %lld %d %d %d %lld %d %u %u %u %u %d %31s %95s",
                       &g->index, &g->total_mib, &g->persistence, &g->compute_mode,
                       &g->temperature, &g->stuck_mib, &g->lost, &g->remap_corr,
                       &g->remap_unc, &g->remap_pending, &g->remap_failure,
                       &g->retired_pending, g->bus_id, g->uuid) == 14) {
                set_str(g->name, sizeof g->name, rest_of(line, 15));
                st->ngpus++;
            }
        } else if (strncmp(line, "mem ", 4) == 0) {
            int index;
            long long idle, reserved;
            if (sscanf(line, "mem %d %lld %lld", &index, &idle, &reserved) == 3) {
                for (int i = 0; i < st->ngpus; i++) {
                    if (st->gpus[i].index == index) {
                        st->gpus[i].idle_mib = idle;
                        st->gpus[i].reserved_mib = reserved;
                    }
                }
            }
        } else if (strncmp(line, "minor ", 6) == 0) {
            int index, minor;
            if (sscanf(line, "minor %d %d", &index, &minor) == 2)
                for (int i = 0; i < st->ngpus; i++)
                    if (st->gpus[i].index == index) {
                        st->gpus[i].has_minor = 1;
                        st->gpus[i].minor = minor;
                    }
        } else if (strncmp(line, "recovery ", 9) == 0) {
            int index, action;
            if (sscanf(line, "recovery %d %d", &index, &action) == 2)
                for (int i = 0; i < st->ngpus; i++)
                    if (st->gpus[i].index == index) st->gpus[i].recovery = action;
        } else if (strncmp(line, "na ", 3) == 0 && st->nna < MAX_NA) {
            sim_na *n = &st->na[st->nna];
            if (sscanf(line, "na %63s %d %d", n->field, &n->gpu, &n->code) == 3) st->nna++;
        }
    }
    fclose(f);
    return 0;
}

/* The NVML code an injected N/A fault gives for field on GPU index, or 0. */
static int na_code(const sim_state *st, const char *field, int index)
{
    for (int i = 0; i < st->nna; i++)
        if (strcmp(st->na[i].field, field) == 0 && (st->na[i].gpu < 0 || st->na[i].gpu == index))
            return st->na[i].code;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Alive: the pid runs, is not a zombie and, when known, still has the recorded start time. */
static int pid_alive(long pid, long long starttime)
{
    char path[64], buf[4096];
    FILE *f;
    size_t n;
    char *p, *tok, *save = NULL;
    char state = 0;
    long long start = -1;

    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    f = fopen(path, "r");
    if (!f) return 0;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    p = strrchr(buf, ')');
    if (!p) return 0;
    p += 2;
    /* Field 3 (state) is token 0; field 22 (starttime) is token 19. */
    tok = strtok_r(p, " ", &save);
    for (int i = 0; tok; i++, tok = strtok_r(NULL, " ", &save)) {
        if (i == 0) state = tok[0];
        if (i == 19) { start = atoll(tok); break; }
    }
    if (state == 'Z' || state == 'X' || state == 'x' || state == 0) return 0;
    return starttime < 0 || start == starttime;
}

static void parse_ints(char *text, int *out, int *count)
{
    char *save = NULL;
    *count = 0;
    for (char *tok = strtok_r(text, " \n", &save); tok && *count < MAX_GPUS;
         tok = strtok_r(NULL, " \n", &save))
        out[(*count)++] = atoi(tok);
}

static int load_record(const char *path, sim_rec *r)
{
    char line[1024];
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    memset(r, 0, sizeof *r);
    r->starttime = -1;
    r->died_at = -1;
    r->pid = -1;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "pid %ld", &r->pid) == 1) {
        } else if (sscanf(line, "starttime %lld", &r->starttime) == 1) {
        } else if (sscanf(line, "created %lf", &r->created) == 1) {
        } else if (sscanf(line, "mib %lld", &r->mib) == 1) {
        } else if (sscanf(line, "util %d", &r->util) == 1) {
        } else if (sscanf(line, "leak %d", &r->leak) == 1) {
        } else if (sscanf(line, "died_at %lf", &r->died_at) == 1) {
        } else if (strncmp(line, "gpus", 4) == 0) {
            parse_ints(line + 4, r->gpus, &r->ngpus);
        } else if (strncmp(line, "reset", 5) == 0) {
            parse_ints(line + 5, r->reset, &r->nreset);
        } else if (strncmp(line, "name ", 5) == 0) {
            set_str(r->name, sizeof r->name, rest_of(line, 1));
        }
    }
    fclose(f);
    return r->pid < 0 ? -1 : 0;
}

static int cmp_rec(const void *a, const void *b)
{
    const sim_rec *x = a, *y = b;
    if (x->created != y->created) return x->created < y->created ? -1 : 1;
    return (x->pid > y->pid) - (x->pid < y->pid);
}

/* Every allocation record, in gpusim's order (created, pid), each with alive set. */
static sim_rec *load_records(int *count)
{
    char dir[PATH_MAX + 64], path[PATH_MAX + 400];
    DIR *d;
    struct dirent *e;
    sim_rec *recs = calloc(MAX_RECS, sizeof *recs);
    *count = 0;
    if (!recs) return NULL;
    snprintf(dir, sizeof dir, "%s/var/lib/gpusim/procs", root_dir);
    d = opendir(dir);
    if (!d) return recs;
    while ((e = readdir(d)) && *count < MAX_RECS) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".nvml") != 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (load_record(path, &recs[*count]) == 0) {
            recs[*count].alive = pid_alive(recs[*count].pid, recs[*count].starttime);
            (*count)++;
        }
    }
    closedir(d);
    qsort(recs, *count, sizeof *recs, cmp_rec);
    return recs;
}

static int has(const int *list, int n, int value)
{
    for (int i = 0; i < n; i++)
        if (list[i] == value) return 1;
    return 0;
}

/* Memory used (MiB) and utilisation (%) of GPU index, as gpusim's nvidia-smi computes them. */
static void usage(const sim_state *st, const sim_gpu *g, long long *used, int *util)
{
    int n;
    double now = now_s();
    sim_rec *recs = load_records(&n);
    *used = g->stuck_mib + g->idle_mib;
    *util = 0;
    for (int i = 0; recs && i < n; i++) {
        sim_rec *r = &recs[i];
        if (!has(r->gpus, r->ngpus, g->index)) continue;
        if (r->alive) {
            *used += r->mib;
            if (r->util > *util) *util = r->util;
            continue;
        }
        /* Dead before anyone recorded when: it died now, as far as this reader can tell. */
        double died = r->died_at < 0 ? now : r->died_at;
        if ((r->leak || now < died + st->release_delay) && !has(r->reset, r->nreset, g->index))
            *used += r->mib;
    }
    free(recs);
}

/* ------------------------------------------------------------------ helpers for entry points */

static nvmlReturn_t copy_string(char *out, unsigned length, const char *value)
{
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

/* Loads the state and finds the device's GPU; a lost GPU answers with its code. */
static nvmlReturn_t device(nvmlDevice_t dev, sim_state *st, sim_gpu **gpu, int allow_lost)
{
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!dev) return NVML_ERROR_INVALID_ARGUMENT;
    if (load_state(st) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    for (int i = 0; i < st->ngpus; i++) {
        if ((unsigned)st->gpus[i].index == dev->index) {
            *gpu = &st->gpus[i];
            if (st->gpus[i].lost && !allow_lost) return st->gpus[i].lost;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

#define DEVICE(dev, allow_lost)                          \
    sim_state *st = malloc(sizeof(sim_state));           \
    sim_gpu *g = NULL;                                   \
    nvmlReturn_t rc;                                     \
    if (!st) return NVML_ERROR_UNKNOWN;                  \
    rc = device(dev, st, &g, allow_lost);                \
    if (rc != NVML_SUCCESS) { free(st); return rc; }

#define RETURN(value) do { free(st); return (value); } while (0)
#define NA(field) do { int c_ = na_code(st, field, g->index); if (c_) RETURN(c_); } while (0)

/* ------------------------------------------------------------------ init and system */

nvmlReturn_t nvmlInitWithFlags(unsigned flags)
{
    sim_state *st = malloc(sizeof(sim_state));
    int rc;
    (void)flags;
    if (!st) return NVML_ERROR_UNKNOWN;
    find_root();
    rc = load_state(st);
    if (rc == 0 && st->driver_not_loaded) rc = NVML_ERROR_DRIVER_NOT_LOADED;
    if (rc == 0 && st->mismatch) rc = NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    free(st);
    if (rc == 0) init_count++;
    return rc;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void)
{
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    init_count--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
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
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned length)
{
    sim_state st;
    int code;
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (load_state(&st) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    /* nvidia-smi prints the driver version per GPU; only an N/A on every GPU hides it here. */
    code = na_code(&st, "driver_version", -1);
    if (code) return code;
    return copy_string(version, length, st.driver);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned length)
{
    sim_state st;
    char text[96];
    if (load_state(&st) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    snprintf(text, sizeof text, "12.%s", st.driver);
    return copy_string(version, length, text);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = 12040;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version)
{
    return nvmlSystemGetCudaDriverVersion(version);
}

nvmlReturn_t nvmlSystemGetProcessName(unsigned pid, char *name, unsigned length)
{
    int n;
    char path[64], buf[4096];
    FILE *f;
    size_t got;
    sim_rec *recs;
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    recs = load_records(&n);
    for (int i = 0; recs && i < n; i++) {
        if (recs[i].pid == (long)pid && recs[i].alive) {
            snprintf(buf, sizeof buf, "%s", recs[i].name);
            free(recs);
            return copy_string(name, length, buf);
        }
    }
    free(recs);
    snprintf(path, sizeof path, "/proc/%u/cmdline", pid);
    f = fopen(path, "r");
    if (!f) return NVML_ERROR_NOT_FOUND;
    got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = '\0';
    if (!got) return NVML_ERROR_NOT_FOUND;
    return copy_string(name, length, buf);
}

/* ------------------------------------------------------------------ devices */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count)
{
    sim_state st;
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (load_state(&st) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (st.hang > 0) {
        /* A driver call stuck on a sick GPU: the caller has to give up on it. */
        struct timespec ts = { (time_t)st.hang, (long)((st.hang - (time_t)st.hang) * 1e9) };
        while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
    }
    *count = st.no_devices ? 0 : (unsigned)st.ngpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t *dev)
{
    sim_state st;
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!dev) return NVML_ERROR_INVALID_ARGUMENT;
    if (load_state(&st) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (st.no_devices || index >= (unsigned)st.ngpus || index >= MAX_GPUS)
        return NVML_ERROR_INVALID_ARGUMENT;
    handles[index].index = index;
    *dev = &handles[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned index, nvmlDevice_t *dev)
{
    return nvmlDeviceGetHandleByIndex_v2(index, dev);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *dev)
{
    sim_state st;
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !dev) return NVML_ERROR_INVALID_ARGUMENT;
    if (load_state(&st) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    for (int i = 0; i < st.ngpus; i++)
        if (strcmp(st.gpus[i].uuid, uuid) == 0)
            return nvmlDeviceGetHandleByIndex_v2((unsigned)st.gpus[i].index, dev);
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *dev)
{
    sim_state st;
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!bus_id || !dev) return NVML_ERROR_INVALID_ARGUMENT;
    if (load_state(&st) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    for (int i = 0; i < st.ngpus; i++)
        if (strcasecmp(st.gpus[i].bus_id, bus_id) == 0 || strcasecmp(st.gpus[i].bus_id + 4, bus_id) == 0)
            return nvmlDeviceGetHandleByIndex_v2((unsigned)st.gpus[i].index, dev);
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned *index)
{
    DEVICE(dev, 1);
    if (!index) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned)g->index;
    RETURN(NVML_SUCCESS);
}

/* The minor number comes from the kernel driver's own record of the device, so it is taken to
   answer for a lost GPU too (a guess: no public report of this call on a lost GPU was found). */
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned *minor)
{
    DEVICE(dev, 1);
    if (!minor) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *minor = (unsigned)(g->has_minor ? g->minor : g->index);
    RETURN(NVML_SUCCESS);
}

/* The driver keeps a lost GPU's PCI location: the one query that still answers. */
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci)
{
    unsigned domain = 0, bus = 0, slot = 0, fn = 0;
    DEVICE(dev, 1);
    if (!pci) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->lost) NA("pci.bus_id");
    memset(pci, 0, sizeof *pci);
    sscanf(g->bus_id, "%x:%x:%x.%x", &domain, &bus, &slot, &fn);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = slot;
    pci->pciDeviceId = 0x233510DE;
    pci->pciSubSystemId = 0x18BE10DE;
    snprintf(pci->busId, sizeof pci->busId, "%s", g->bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain, bus, slot, fn);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t dev, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(dev, pci);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned length)
{
    DEVICE(dev, 0);
    NA("name");
    RETURN(copy_string(name, length, g->name));
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned length)
{
    DEVICE(dev, 0);
    NA("uuid");
    RETURN(copy_string(uuid, length, g->uuid));
}

/* Total, reserved, allocated (v2 used) and free memory of a GPU, in bytes. */
static nvmlReturn_t memory(nvmlDevice_t dev, unsigned long long *total, unsigned long long *reserved,
                           unsigned long long *used, unsigned long long *free_)
{
    long long used_mib, free_mib;
    int util;
    DEVICE(dev, 0);
    /* One driver call answers all four: N/A on any of them fails the call. */
    NA("memory.total");
    NA("memory.used");
    NA("memory.free");
    NA("memory.reserved");
    usage(st, g, &used_mib, &util);
    free_mib = g->total_mib - g->reserved_mib - used_mib;
    *total = (unsigned long long)g->total_mib * MIB;
    *reserved = (unsigned long long)g->reserved_mib * MIB;
    *used = (unsigned long long)used_mib * MIB;
    *free_ = free_mib < 0 ? 0 : (unsigned long long)free_mib * MIB;
    RETURN(NVML_SUCCESS);
}

/* v1: `used` is reserved + allocated, so an idle GPU reads what the driver reserves. */
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *mem)
{
    unsigned long long reserved;
    nvmlReturn_t rc;
    if (!mem) return NVML_ERROR_INVALID_ARGUMENT;
    rc = memory(dev, &mem->total, &reserved, &mem->used, &mem->free);
    if (rc == NVML_SUCCESS) mem->used += reserved;
    return rc;
}

#ifndef GPUSIM_NO_MEMORY_V2
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem)
{
    if (!mem) return NVML_ERROR_INVALID_ARGUMENT;
    if (mem->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    return memory(dev, &mem->total, &mem->reserved, &mem->used, &mem->free);
}
#endif

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *rates)
{
    long long used;
    int util;
    DEVICE(dev, 0);
    if (!rates) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    NA("utilization.gpu");
    usage(st, g, &used, &util);
    rates->gpu = (unsigned)util;
    rates->memory = (unsigned)(util / 2 > 100 ? 100 : util / 2);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned *temp)
{
    long long used;
    int util;
    DEVICE(dev, 0);
    if (!temp) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (sensor != 0) RETURN(NVML_ERROR_NOT_SUPPORTED);
    NA("temperature.gpu");
    usage(st, g, &used, &util);
    *temp = (unsigned)(g->temperature + util / 5);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t dev, int *mode)
{
    DEVICE(dev, 0);
    if (!mode) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    NA("persistence_mode");
    *mode = g->persistence ? 1 : 0;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t dev, int *mode)
{
    DEVICE(dev, 0);
    if (!mode) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    NA("compute_mode");
    *mode = g->compute_mode;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t dev, unsigned *corr, unsigned *unc,
                                       unsigned *pending, unsigned *failure)
{
    DEVICE(dev, 0);
    if (!corr || !unc || !pending || !failure) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    NA("remapped_rows.pending");
    NA("remapped_rows.failure");
    *corr = g->remap_corr;
    *unc = g->remap_unc;
    *pending = g->remap_pending;
    *failure = g->remap_failure;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t dev, int *pending)
{
    DEVICE(dev, 0);
    if (!pending) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    NA("retired_pages.pending");
    if (g->retired_pending < 0) RETURN(NVML_ERROR_NOT_SUPPORTED);
    *pending = g->retired_pending;
    RETURN(NVML_SUCCESS);
}

/* nvmlFieldValue_t, as nvml.h lays it out (and nvidia-ml-py's c_nvmlFieldValue_t). */
typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    int nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

#define NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230
#define NVML_VALUE_TYPE_UNSIGNED_INT 1

/* Field values: only the GPU Recovery Action (230) is known; every other field, and that one on a
   driver before 565, answers NOT_SUPPORTED in its own nvmlReturn, as the real call does. */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int count, nvmlFieldValue_t *values)
{
    DEVICE(dev, 0);
    if (count < 0 || (count > 0 && !values)) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < count; i++) {
        values[i].timestamp = (long long)(now_s() * 1e6);
        values[i].latencyUsec = 0;
        values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        if (values[i].fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION && g->recovery >= 0) {
            values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            values[i].value.ullVal = 0;
            values[i].value.uiVal = (unsigned)g->recovery;
            values[i].nvmlReturn = NVML_SUCCESS;
        }
    }
    RETURN(NVML_SUCCESS);
}

/* Live holders with memory on the GPU, as nvidia-smi --query-compute-apps lists them; into
 * infos (v2/v3 structs) or, for the unversioned call, v1 (pid and memory only). */
static nvmlReturn_t processes(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_t *infos,
                              nvmlProcessInfo_v1_t *v1)
{
    int n, found = 0;
    sim_rec *recs;
    int na_mem;
    DEVICE(dev, 0);
    if (!count) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    na_mem = na_code(st, "used_gpu_memory", g->index);
    recs = load_records(&n);
    for (int i = 0; recs && i < n; i++) {
        sim_rec *r = &recs[i];
        if (!r->alive || r->mib <= 0 || !has(r->gpus, r->ngpus, g->index)) continue;
        if (infos && (unsigned)found < *count) {
            infos[found].pid = (unsigned)r->pid;
            infos[found].usedGpuMemory = na_mem ? NOT_AVAILABLE_ULL : (unsigned long long)r->mib * MIB;
            infos[found].gpuInstanceId = NOT_AVAILABLE_UINT;
            infos[found].computeInstanceId = NOT_AVAILABLE_UINT;
        }
        if (v1 && (unsigned)found < *count) {
            v1[found].pid = (unsigned)r->pid;
            v1[found].usedGpuMemory = na_mem ? NOT_AVAILABLE_ULL : (unsigned long long)r->mib * MIB;
        }
        found++;
    }
    free(recs);
    if ((!infos && !v1) || (unsigned)found > *count) {
        *count = (unsigned)found;
        RETURN(found ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS);
    }
    *count = (unsigned)found;
    RETURN(NVML_SUCCESS);
}

#ifndef GPUSIM_NO_PROCESSES_V3
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned *count,
                                                     nvmlProcessInfo_t *infos)
{
    return processes(dev, count, infos, NULL);
}
#endif

#ifndef GPUSIM_NO_PROCESSES_V2
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t dev, unsigned *count,
                                                     nvmlProcessInfo_t *infos)
{
    return processes(dev, count, infos, NULL);
}
#endif

/* The unversioned symbol every library keeps: the v1 struct. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t dev, unsigned *count,
                                                  nvmlProcessInfo_v1_t *infos)
{
    return processes(dev, count, NULL, infos);
}
