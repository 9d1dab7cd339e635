/* The internals vnpu.c and fair.c share: the handle, its pools and tables, and the
 * helpers both use. Not part of the cffi cdef. */
#ifndef VNPU_INTERNAL_H
#define VNPU_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "vnpu.h"

#define CENTI 100
#define NEVER ((int64_t)VNPU_NEVER)
#define QUEUED 0
#define RUNNING 1
#define NO_SLOT (-1)
#define VNPU_FLOW_CACHE 64 /* flows without live work a device keeps for reuse */

/* ---------------------------------------------------------------------------------------
 * Types
 * ------------------------------------------------------------------------------------- */

typedef struct {
    int64_t id;
    int64_t model;
    int64_t remaining_cc;
    int64_t run_start_us;
    int64_t synced_us;
    int32_t uid;
    int32_t original_uid;
    int32_t job_priority;
    int32_t effective_priority;
    int32_t debug_pid;
    int32_t group_idx;
    int32_t feature_idx;
    int32_t device;
    int32_t channel;
    int32_t heap_pos;
    int32_t next_free;
    int32_t flow;     /* fair: the slot of the job's flow */
    int64_t acct_us;  /* fair: virtual runtime charged up to here while running */
    int32_t band;     /* fair: the band of effective_priority */
    int32_t qprev;    /* fair: neighbours in the flow's queue, by (priority, id) */
    int32_t qnext;
    uint8_t state;
    uint8_t started_before;
} work_t;

typedef struct {
    int64_t id;
    int64_t weight_bytes;
    int64_t sram_bytes;
    int32_t device;
    int32_t next_free;
} model_t;

/* fair: one uid's work in one band of one device. */
typedef struct {
    int64_t key;
    int64_t vruntime;
    int32_t head, tail; /* queued work, by (effective priority, id) */
    int32_t running;
    int32_t band;
    int32_t uid;
    int32_t prev, next; /* the device's list of flows */
    int32_t sim;        /* a cursor into the queue while picks are ranked */
    int32_t next_free;
    int32_t reused;
    int32_t empty; /* no live work: kept for reuse (see fair_left) */
} flow_t;

typedef struct {
    int64_t model;
    int64_t cost_cycles;
    int64_t period_us;
    int64_t next_us;
    int32_t uid;
    int32_t original_uid;
    int32_t job_priority;
    int32_t remaining;
    int32_t burst;
    int32_t group_idx;
    int32_t feature_idx;
    int32_t debug_pid;
} gen_t;

/* Open addressing with linear probing over a table at most half full; key 0 marks an empty
 * slot. Keys are spread by Fibonacci hashing: sequential ids would otherwise form one long
 * cluster, and backward-shift deletion walks to the end of a key's cluster. */
typedef struct {
    int64_t key;
    int32_t val;
} entry_t;

typedef struct {
    entry_t *tab;
    uint64_t mask;
    int shift;
} map_t;

typedef struct {
    vnpu_handle *h;
    int32_t number;
} worker_arg_t;

typedef struct {
    vnpu_spec spec;
    int64_t temp_mc;
    int64_t peak_temp_mc;
    int32_t severity;
    int64_t weight_used;
    int32_t models;
    int64_t next_tick_us;
    int has_tick;
    int dirty;
    int64_t throttled_us;
    int64_t throttled_since;
    int throttling;
    int32_t nch;
    int32_t ch[VNPU_MAX_CHANNELS];
    int32_t *heap;
    int32_t heap_n;
    int fair;
    int32_t queued; /* fair: jobs in the flows' queues */
    int32_t flows;  /* fair: the first flow of the device's list */
    int32_t nempty; /* fair: flows in the list kept with no live work */
    int64_t live[VNPU_MAX_BANDS];
    int64_t busy[VNPU_MAX_BANDS];
    int64_t credit[VNPU_MAX_BANDS];
    int64_t folded_us;
    int64_t checked_us;
    gen_t *gens;
    int32_t ngen;
    int32_t gen_cap;
    /* Cached minima, recomputed when stale: of the running jobs' completions (stale after
     * any change to what runs, how far it got, or the clock speed) and of the generators'
     * next arrivals (stale after any change to the generators). */
    int64_t comp_min;
    int comp_stale;
    int64_t gen_min;
    int gen_stale;
    pthread_cond_t wake;
    int wake_ready;
    int64_t sleep_until;
    pthread_t thread;
    int thread_started;
    worker_arg_t arg;
} device_t;

struct vnpu_handle {
    pthread_mutex_t mu;
    pthread_cond_t space;
    int mu_ready;
    int space_ready;
    int real;
    int closed;
    int closing;
    int64_t clock_us;
    int32_t ndev;
    device_t dev[VNPU_MAX_DEVICES];

    int32_t max_live;
    int32_t live;
    int32_t pool_hw;
    int32_t pool_free;
    work_t *pool;
    map_t work_map;
    int64_t next_work_id;
    int64_t *scratch;

    int32_t max_models;
    int32_t nmodels;
    int32_t model_hw;
    int32_t model_free;
    model_t *models;
    map_t model_map;
    int64_t next_model_id;

    flow_t *flowpool;
    int32_t flow_hw;
    int32_t flow_free;
    map_t flow_map;

    vnpu_config unknown;
    vnpu_config *configs;
    int32_t nconfigs;
    map_t config_map;

    vnpu_event *ev;
    int64_t ev_cap;
    int64_t ev_head;
    int64_t ev_n;
    int64_t ev_soft;
    int64_t ev_total;
    int64_t ev_dropped;
    int64_t stalls;
    int32_t sleeping;
    int space_waiters;
    int efd;
    int efd_armed;
};

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* -(-a // b) for a >= 0, b > 0. */
static inline int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

static inline int key_less(const work_t *a, const work_t *b) {
    if (a->effective_priority != b->effective_priority)
        return a->effective_priority < b->effective_priority;
    return a->id < b->id;
}

static inline int64_t boundary_us(const device_t *d, const work_t *w, int64_t now) {
    int64_t slice = d->spec.slice_us;
    int64_t elapsed = now - w->run_start_us;
    int64_t k = elapsed > 0 ? ceil_div(elapsed, slice) : 0;
    if (k < 1) k = 1;
    return w->run_start_us + k * slice;
}

/* The id -> slot tables (keys are > 0); vnpu.c creates them. */
static inline uint64_t map_home(const map_t *m, int64_t key) {
    return ((uint64_t)key * UINT64_C(0x9E3779B97F4A7C15)) >> m->shift;
}

static inline int32_t map_get(const map_t *m, int64_t key) {
    if (key <= 0 || !m->tab) return NO_SLOT;
    for (uint64_t i = map_home(m, key);; i = (i + 1) & m->mask) {
        if (m->tab[i].key == key) return m->tab[i].val;
        if (m->tab[i].key == 0) return NO_SLOT;
    }
}

static inline void map_put(map_t *m, int64_t key, int32_t val) {
    uint64_t i = map_home(m, key);
    while (m->tab[i].key != 0 && m->tab[i].key != key) i = (i + 1) & m->mask;
    m->tab[i].key = key;
    m->tab[i].val = val;
}

/* Deletion by backward shift: later entries of the cluster move up so probes still work. */
static inline void map_del(map_t *m, int64_t key) {
    uint64_t i = map_home(m, key);
    while (m->tab[i].key != key) {
        if (m->tab[i].key == 0) return;
        i = (i + 1) & m->mask;
    }
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        if (m->tab[j].key == 0) break;
        uint64_t k = map_home(m, m->tab[j].key);
        /* Move j into the hole at i unless j's home lies cyclically in (i, j]. */
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            m->tab[i] = m->tab[j];
            i = j;
        }
    }
    m->tab[i].key = 0;
}

/* vnpu.c */
int32_t effective(const vnpu_handle *h, int32_t uid, int32_t original_uid, int32_t job_priority);
int cmp_ids(const void *a, const void *b);

/* fair.c: each call first brings virtual runtimes and floor credits up to t. */
void sort_by_channel(const vnpu_handle *h, int32_t *out, int32_t m);
void fold_since(vnpu_handle *h, device_t *d, int64_t t);
void fair_enqueue(vnpu_handle *h, device_t *d, int32_t s, int64_t t);
void fair_remove(vnpu_handle *h, device_t *d, int32_t s, int64_t t);
void fair_start(vnpu_handle *h, device_t *d, int32_t s, int64_t t);
void fair_stop(vnpu_handle *h, device_t *d, int32_t s, int64_t t, int requeue);
int32_t fair_pick(vnpu_handle *h, device_t *d, int64_t t);
int32_t fair_victims_queued(vnpu_handle *h, device_t *d, int64_t t, int32_t *out);
int64_t fair_next_pause_queued(const vnpu_handle *h, const device_t *d, int64_t now);

/* Virtual runtimes and floor credits up to t (the rates have been constant since). */
static inline void fold(vnpu_handle *h, device_t *d, int64_t t) {
    if (d->fair && t != d->folded_us) fold_since(h, d, t);
    d->folded_us = t;
}

/* The running jobs to pause at t, by channel (once per event point). */
static inline int32_t fair_victims(vnpu_handle *h, device_t *d, int64_t t, int32_t *out) {
    d->checked_us = t;
    return d->queued == 0 ? 0 : fair_victims_queued(h, d, t, out);
}

/* The earliest time at which fair_victims may pause something (NEVER if none). */
static inline int64_t fair_next_pause(const vnpu_handle *h, const device_t *d, int64_t now) {
    return d->queued == 0 ? NEVER : fair_next_pause_queued(h, d, now);
}
int32_t fair_queued_ids(const vnpu_handle *h, const device_t *d, int64_t model, int64_t *ids,
                        int32_t n);
void fair_rerank(vnpu_handle *h, device_t *d, int32_t dn, int64_t t);

#endif /* VNPU_INTERNAL_H */
