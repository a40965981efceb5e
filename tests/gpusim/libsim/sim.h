/*
 * What gpusim's C libraries share (libnvml/nvml.c, libcuda/cuda.c): the simulated host's flat
 * state files (gpusim/state.py, flat_text), the allocation records, liveness in /proc, and
 * memory used as the fake nvidia-smi computes it (gpusim/state.py, gpu_usage).
 *
 * Included by each library's one source file; its functions are static, and marked unused
 * for the library that does not call one.
 */
#ifndef GPUSIM_SIM_H
#define GPUSIM_SIM_H

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


#define MAX_GPUS 64
#define MAX_NA 256
#define MAX_RECS 1024
#define MAX_FLIPS 8
#define MAX_MIG 7
/* nvml.h's NVML_NVLINK_MAX_LINKS: an H100 or H200 has 18 NVLinks, no GPU more. */
#define NVLINK_MAX_LINKS 18
/* The buckets of the row remapper's histogram: max, high, partial, low, none. */
#define REMAP_BUCKETS 5
#define MIB (1024ULL * 1024ULL)
#define NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFULL
#define NOT_AVAILABLE_UINT 0xFFFFFFFFU

/* A MIG device: one compute instance of a GPU instance ("migdev" lines of state.nvml). */
typedef struct {
    int gi, ci;
    long long total_mib;
    char uuid[96];
    char profile[32];
} sim_mig;

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
    int cuda_error;           /* 0, or the CUresult the fake libcuda gives on this GPU */
    double cuda_hang;         /* seconds cuCtxCreate_v2 sleeps on this GPU (fake libcuda) */
    int cuda_crash;           /* 0, or the signal cuCtxCreate_v2 raises on this GPU (fake libcuda) */
    int cuda_jit;             /* 0, or the CUresult cuModuleLoadData(Ex) returns on this GPU */
    int cuda_launch;          /* 0, or the CUresult a kernel launch on this GPU meets */
    int cuda_idle;            /* kernel launches on this GPU return success and do nothing */
    int nflips;               /* bits flipped in the memory the probe's fill kernel writes: */
    long long flip_offset[MAX_FLIPS];  /* ... the byte, counted over what the fills wrote, in order */
    int flip_bit[MAX_FLIPS];  /* ... and the bit of that byte */
    unsigned remap_corr, remap_unc, remap_pending, remap_failure;
    int retired_pending;      /* -1: not supported */
    int recovery;             /* the driver's GPU Recovery Action; -1: no such field (before 565) */
    int max_gen, max_width;   /* the PCIe link the GPU and its slot allow ("link" lines) ... */
    int link_gen, link_width; /* ... and the one it runs under load (gen 1 at that width while idle) */
    double h2d_gbps, d2h_gbps;  /* copy bandwidths as configured (GB/s), before the link caps them */
    double hbm_gbps;          /* memory bandwidth: what the probe's kernels take to sweep memory */
    int replays;              /* PCIe replays each copy adds to the GPU's counter (`fault slow`) */
    double copy_hang;         /* seconds each copy sleeps first (`fault slow --copy-hang`) */
    unsigned nvlink_down;     /* its NVLinks that are down, bit L for link L ("nvlink" lines) ... */
    int nvlink_errors;        /* ... the flit CRC errors each peer copy over NVLink adds to its link 0 ... */
    double p2p_gbps;          /* ... and its cap on peer copies (0: none) */
    unsigned remap_histogram[REMAP_BUCKETS];  /* banks with max .. none spare rows ("remap_histogram" lines) */
    char bus_id[32];
    char uuid[96];
    char name[96];
    int mig_current, mig_pending;  /* MIG mode ("mig" lines): 1 enabled */
    int nmig;                 /* MIG devices, in MIG device index order */
    sim_mig mig[MAX_MIG];
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
    int freed[MAX_GPUS];      /* GPUs whose allocation the process freed (fake libcuda) ... */
    double freed_at[MAX_GPUS];  /* ... and when: released like a death, with the delay */
    int nfreed;
    char name[256];
    int alive;
    int mig_gi, mig_ci;       /* the MIG instance it runs on; -1: none */
} sim_rec;

typedef struct {
    char driver[80];
    double release_delay;
    double hang;
    int driver_not_loaded, no_devices, mismatch;
    int cuda_init;            /* 0, or the CUresult cuInit returns (fake libcuda) */
    double cuda_hang;         /* seconds cuInit sleeps before it answers */
    int nvlink_links;         /* NVLinks per GPU (`gpusim nvlink`); 0: no NVLink, the GPUs talk over PCIe */
    sim_gpu gpus[MAX_GPUS];
    int ngpus;
    sim_na na[MAX_NA];
    int nna;
} sim_state;


static char root_dir[PATH_MAX];


/* ------------------------------------------------------------------ state files */

__attribute__((unused)) static void find_root(void)
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
__attribute__((unused)) static void set_str(char *dst, size_t size, const char *src)
{
    size_t n = strlen(src);
    if (n >= size) n = size - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

__attribute__((unused)) static char *rest_of(char *line, int skip_words)
{
    while (skip_words-- > 0) {
        while (*line && *line != ' ') line++;
        while (*line == ' ') line++;
    }
    line[strcspn(line, "\n")] = '\0';
    return line;
}

/* Returns 0, or -1 when there is no simulated host (no driver). */
/* A "mig INDEX CURRENT PENDING" or "migdev INDEX GI CI TOTAL_MIB UUID PROFILE" line, for a GPU read before. */
__attribute__((unused)) static void load_mig_line(sim_state *st, const char *line)
{
    int index, a, b;
    sim_mig m;
    if (sscanf(line, "migdev %d %d %d %lld %95s %31s", &index, &m.gi, &m.ci, &m.total_mib, m.uuid, m.profile) == 6) {
        for (int i = 0; i < st->ngpus; i++)
            if (st->gpus[i].index == index && st->gpus[i].nmig < MAX_MIG) st->gpus[i].mig[st->gpus[i].nmig++] = m;
    } else if (sscanf(line, "mig %d %d %d", &index, &a, &b) == 3) {
        for (int i = 0; i < st->ngpus; i++)
            if (st->gpus[i].index == index) {
                st->gpus[i].mig_current = a;
                st->gpus[i].mig_pending = b;
            }
    }
}

__attribute__((unused)) static int load_state(sim_state *st)
{
    char path[PATH_MAX + 64], line[1024];
    FILE *f;

    memset(st, 0, sizeof *st);
    snprintf(path, sizeof path, "%s/var/lib/gpusim/state.nvml", root_dir);
    f = fopen(path, "r");
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "driver ", 7) == 0) {
            set_str(st->driver, sizeof st->driver, rest_of(line, 1));
        } else if (sscanf(line, "release_delay %lf", &st->release_delay) == 1) {
        } else if (sscanf(line, "hang %lf", &st->hang) == 1) {
        } else if (sscanf(line, "driver_not_loaded %d", &st->driver_not_loaded) == 1) {
        } else if (sscanf(line, "no_devices %d", &st->no_devices) == 1) {
        } else if (sscanf(line, "mismatch %d", &st->mismatch) == 1) {
        } else if (sscanf(line, "cuda_init %d", &st->cuda_init) == 1) {
        } else if (sscanf(line, "cuda_hang %lf", &st->cuda_hang) == 1) {
        } else if (sscanf(line, "nvlink_links %d", &st->nvlink_links) == 1) {
        } else if (strncmp(line, "cuda_gpu ", 9) == 0) {
            int index, code;
            if (sscanf(line, "cuda_gpu %d %d", &index, &code) == 2)
                for (int i = 0; i < st->ngpus; i++)
                    if (st->gpus[i].index == index) st->gpus[i].cuda_error = code;
        } else if (strncmp(line, "cuda_gpu_hang ", 14) == 0) {
            int index;
            double seconds;
            if (sscanf(line, "cuda_gpu_hang %d %lf", &index, &seconds) == 2)
                for (int i = 0; i < st->ngpus; i++)
                    if (st->gpus[i].index == index) st->gpus[i].cuda_hang = seconds;
        } else if (strncmp(line, "cuda_gpu_crash ", 15) == 0) {
            int index, sig;
            if (sscanf(line, "cuda_gpu_crash %d %d", &index, &sig) == 2)
                for (int i = 0; i < st->ngpus; i++)
                    if (st->gpus[i].index == index) st->gpus[i].cuda_crash = sig;
        } else if (strncmp(line, "cuda_gpu_kernel ", 16) == 0) {
            int index, jit, launch, idle;
            if (sscanf(line, "cuda_gpu_kernel %d %d %d %d", &index, &jit, &launch, &idle) == 4)
                for (int i = 0; i < st->ngpus; i++)
                    if (st->gpus[i].index == index) {
                        st->gpus[i].cuda_jit = jit;
                        st->gpus[i].cuda_launch = launch;
                        st->gpus[i].cuda_idle = idle;
                    }
        } else if (strncmp(line, "cuda_gpu_flip ", 14) == 0) {
            int index, bit;
            long long offset;
            if (sscanf(line, "cuda_gpu_flip %d %lld %d", &index, &offset, &bit) == 3)
                for (int i = 0; i < st->ngpus; i++)
                    if (st->gpus[i].index == index && st->gpus[i].nflips < MAX_FLIPS) {
                        st->gpus[i].flip_offset[st->gpus[i].nflips] = offset;
                        st->gpus[i].flip_bit[st->gpus[i].nflips++] = bit;
                    }
        } else if (strncmp(line, "gpu ", 4) == 0 && st->ngpus < MAX_GPUS) {
            sim_gpu *g = &st->gpus[st->ngpus];
            if (sscanf(line, "gpu %d %lld %d %d %d %lld %d %u %u %u %u %d %31s %95s",
                       &g->index, &g->total_mib, &g->persistence, &g->compute_mode,
                       &g->temperature, &g->stuck_mib, &g->lost, &g->remap_corr,
                       &g->remap_unc, &g->remap_pending, &g->remap_failure,
                       &g->retired_pending, g->bus_id, g->uuid) == 14) {
                set_str(g->name, sizeof g->name, rest_of(line, 15));
                /* The link of a state written before gpusim had "link" lines: a healthy H200's. */
                g->max_gen = g->link_gen = 5;
                g->max_width = g->link_width = 16;
                g->h2d_gbps = g->d2h_gbps = 55.0;
                g->hbm_gbps = 4000.0;
                /* A healthy H200's row remapper (gpusim/state.py REMAP_HISTOGRAM_DEFAULT). */
                g->remap_histogram[0] = 3072;
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
        } else if (strncmp(line, "link ", 5) == 0) {
            int index, max_gen, max_width, gen, width, replays;
            double h2d, d2h, hbm, hang;
            if (sscanf(line, "link %d %d %d %d %d %lf %lf %lf %d %lf", &index, &max_gen, &max_width, &gen, &width,
                       &h2d, &d2h, &hbm, &replays, &hang) == 10)
                for (int i = 0; i < st->ngpus; i++)
                    if (st->gpus[i].index == index) {
                        sim_gpu *g = &st->gpus[i];
                        g->max_gen = max_gen;
                        g->max_width = max_width;
                        g->link_gen = gen;
                        g->link_width = width;
                        g->h2d_gbps = h2d;
                        g->d2h_gbps = d2h;
                        g->hbm_gbps = hbm;
                        g->replays = replays;
                        g->copy_hang = hang;
                    }
        } else if (strncmp(line, "nvlink ", 7) == 0) {
            int index, errors;
            unsigned down;
            double p2p;
            if (sscanf(line, "nvlink %d %u %d %lf", &index, &down, &errors, &p2p) == 4)
                for (int i = 0; i < st->ngpus; i++)
                    if (st->gpus[i].index == index) {
                        st->gpus[i].nvlink_down = down;
                        st->gpus[i].nvlink_errors = errors;
                        st->gpus[i].p2p_gbps = p2p;
                    }
        } else if (strncmp(line, "remap_histogram ", 16) == 0) {
            int index;
            unsigned v[REMAP_BUCKETS];
            if (sscanf(line, "remap_histogram %d %u %u %u %u %u", &index, &v[0], &v[1], &v[2], &v[3], &v[4]) == 6)
                for (int i = 0; i < st->ngpus; i++)
                    if (st->gpus[i].index == index) memcpy(st->gpus[i].remap_histogram, v, sizeof v);
        } else if (strncmp(line, "mig", 3) == 0) {
            load_mig_line(st, line);
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
__attribute__((unused)) static int na_code(const sim_state *st, const char *field, int index)
{
    for (int i = 0; i < st->nna; i++)
        if (strcmp(st->na[i].field, field) == 0 && (st->na[i].gpu < 0 || st->na[i].gpu == index))
            return st->na[i].code;
    return 0;
}

__attribute__((unused)) static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Sleeps seconds, through signals that interrupt it. */
__attribute__((unused)) static void sleep_s(double seconds)
{
    struct timespec ts;
    if (seconds <= 0) return;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* ------------------------------------------------------------------ the PCIe link's files
 *
 * ROOT/var/lib/gpusim/link/<index>: the time (realtime seconds) until which GPU index's link is
 * loaded, and <index>.replays: its PCIe replay counter. The fake libcuda writes both at each copy,
 * the fake NVML reads them (and the fake nvidia-smi the first, gpusim/state.py link_now).
 */

/* The path of GPU index's link file, with suffix ("" or ".replays"). */
__attribute__((unused)) static void link_path(char *out, size_t size, int index, const char *suffix)
{
    snprintf(out, size, "%s/var/lib/gpusim/link/%d%s", root_dir, index, suffix);
}

/* The number in GPU index's link file with suffix, or 0 when there is none. */
__attribute__((unused)) static double link_number(int index, const char *suffix)
{
    char path[PATH_MAX + 64];
    double value = 0;
    FILE *f;
    link_path(path, sizeof path, index, suffix);
    if (!(f = fopen(path, "r"))) return 0;
    if (fscanf(f, "%lf", &value) != 1) value = 0;
    fclose(f);
    return value;
}

/* The generation GPU g's link runs at now: the loaded one while a copy keeps it loaded, else 1. */
__attribute__((unused)) static int link_gen_now(const sim_gpu *g)
{
    return now_s() < link_number(g->index, "") ? g->link_gen : 1;
}

/* ------------------------------------------------------------------ NVLink (gpusim/state.py peer_path)
 *
 * With `gpusim nvlink --links N` every GPU has N NVLinks to the NVSwitches of an HGX board; `fault slow
 * --nvlink-down` takes some of a GPU's down. ROOT/var/lib/gpusim/link/<index>.nvlink_crc_flit holds the
 * flit CRC errors of its link 0 (the fake libcuda's peer copies add them, the fake NVML reads them).
 */

/* Whether link (< the host's count) of GPU g is up. */
__attribute__((unused)) static int nvlink_up(const sim_state *st, const sim_gpu *g, int link)
{
    return link >= 0 && link < st->nvlink_links && link < NVLINK_MAX_LINKS && !(g->nvlink_down & (1U << link));
}

/* How many of GPU g's NVLinks are up. */
__attribute__((unused)) static int nvlinks_active(const sim_state *st, const sim_gpu *g)
{
    int n = 0;
    for (int link = 0; link < st->nvlink_links; link++) n += nvlink_up(st, g, link);
    return n;
}

/* Alive: the pid runs, is not a zombie and, when known, still has the recorded start time. */
__attribute__((unused)) static int pid_alive(long pid, long long starttime)
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

__attribute__((unused)) static void parse_ints(char *text, int *out, int *count)
{
    char *save = NULL;
    *count = 0;
    for (char *tok = strtok_r(text, " \n", &save); tok && *count < MAX_GPUS;
         tok = strtok_r(NULL, " \n", &save))
        out[(*count)++] = atoi(tok);
}

__attribute__((unused)) static int load_record(const char *path, sim_rec *r)
{
    char line[1024];
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    memset(r, 0, sizeof *r);
    r->starttime = -1;
    r->died_at = -1;
    r->pid = -1;
    r->mig_gi = r->mig_ci = -1;
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
        } else if (strncmp(line, "freed", 5) == 0) {
            char *save = NULL;
            for (char *tok = strtok_r(line + 5, " \n", &save); tok && r->nfreed < MAX_GPUS;
                 tok = strtok_r(NULL, " \n", &save)) {
                char *at = strtok_r(NULL, " \n", &save);
                if (!at) break;
                r->freed[r->nfreed] = atoi(tok);
                r->freed_at[r->nfreed++] = atof(at);
            }
        } else if (sscanf(line, "mig %d %d", &r->mig_gi, &r->mig_ci) == 2) {
        } else if (strncmp(line, "name ", 5) == 0) {
            set_str(r->name, sizeof r->name, rest_of(line, 1));
        }
    }
    fclose(f);
    return r->pid < 0 ? -1 : 0;
}

__attribute__((unused)) static int cmp_rec(const void *a, const void *b)
{
    const sim_rec *x = a, *y = b;
    if (x->created != y->created) return x->created < y->created ? -1 : 1;
    return (x->pid > y->pid) - (x->pid < y->pid);
}

/* Every allocation record, in gpusim's order (created, pid), each with alive set. */
__attribute__((unused)) static sim_rec *load_records(int *count)
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

__attribute__((unused)) static int has(const int *list, int n, int value)
{
    for (int i = 0; i < n; i++)
        if (list[i] == value) return 1;
    return 0;
}

/* When the process freed its allocation on GPU index, or -1 while it holds it. */
__attribute__((unused)) static double freed_at(const sim_rec *r, int index)
{
    for (int i = 0; i < r->nfreed; i++)
        if (r->freed[i] == index) return r->freed_at[i];
    return -1;
}

/* Whether a live process holds its allocation on GPU index (a compute app there). */
__attribute__((unused)) static int holds(const sim_rec *r, int index)
{
    return r->alive && has(r->gpus, r->ngpus, index) && freed_at(r, index) < 0;
}

/* Memory used (MiB) and utilisation (%) of GPU index, as gpusim's nvidia-smi computes them. */
__attribute__((unused)) static void usage(const sim_state *st, const sim_gpu *g, long long *used, int *util)
{
    int n;
    double now = now_s();
    sim_rec *recs = load_records(&n);
    *used = g->stuck_mib + g->idle_mib;
    *util = 0;
    for (int i = 0; recs && i < n; i++) {
        sim_rec *r = &recs[i];
        if (!has(r->gpus, r->ngpus, g->index)) continue;
        if (holds(r, g->index)) {
            *used += r->mib;
            if (r->util > *util) *util = r->util;
            continue;
        }
        /* Dead before anyone recorded when: it died now, as far as this reader can tell. */
        double died = freed_at(r, g->index) >= 0 ? freed_at(r, g->index) : r->died_at < 0 ? now : r->died_at;
        if ((r->leak || now < died + st->release_delay) && !has(r->reset, r->nreset, g->index))
            *used += r->mib;
    }
    free(recs);
}

#endif
