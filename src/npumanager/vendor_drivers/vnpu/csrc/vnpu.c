/* vnpu: the simulated NPU in C. The rules are those of vendor_drivers/reference/engine.py;
 * this file implements them with preallocated pools, per-device binary heaps keyed by
 * (effective priority, id) for the strict scheduler (fair.c holds the fair one), and an
 * id->slot open-addressing table. */
#define _GNU_SOURCE

#include "vnpu_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------- */

/* Python's a // b for b > 0. */
static int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

static int64_t mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int pow2_bits(int64_t atleast) {
    int bits = 4;
    while (((int64_t)1 << bits) < atleast) bits++;
    return bits;
}

/* ---------------------------------------------------------------------------------------
 * The id -> slot table (keys are > 0)
 * ------------------------------------------------------------------------------------- */

static int map_init(map_t *m, int64_t entries) {
    int bits = pow2_bits(entries * 2);
    m->tab = calloc((size_t)1 << bits, sizeof(entry_t));
    if (!m->tab) return VNPU_E_NOMEM;
    m->mask = ((uint64_t)1 << bits) - 1;
    m->shift = 64 - bits;
    return VNPU_OK;
}

/* ---------------------------------------------------------------------------------------
 * Events
 * ------------------------------------------------------------------------------------- */

static void signal_readable(vnpu_handle *h) {
    if (h->efd >= 0 && !h->efd_armed) {
        uint64_t one = 1;
        ssize_t r = write(h->efd, &one, sizeof one);
        (void)r;
        h->efd_armed = 1;
    }
}

static int grow_events(vnpu_handle *h) {
    int64_t cap = h->ev_cap * 2;
    vnpu_event *bigger = malloc((size_t)cap * sizeof(vnpu_event));
    if (!bigger) return 0;
    int64_t first = min64(h->ev_n, h->ev_cap - h->ev_head);
    memcpy(bigger, h->ev + h->ev_head, (size_t)first * sizeof(vnpu_event));
    memcpy(bigger + first, h->ev, (size_t)(h->ev_n - first) * sizeof(vnpu_event));
    free(h->ev);
    h->ev = bigger;
    h->ev_cap = cap;
    h->ev_head = 0;
    return 1;
}

static void emit_fields(vnpu_handle *h, int kind, int reason, int64_t id, int32_t group_idx,
                        int32_t uid, int32_t debug_pid, int32_t original_uid,
                        int32_t feature_idx, int32_t job_priority, int32_t effective_priority,
                        int32_t device, int64_t model, int64_t t) {
    if (h->ev_n == h->ev_cap && !grow_events(h)) {
        h->ev_dropped++;
        return;
    }
    vnpu_event *e = &h->ev[(h->ev_head + h->ev_n) % h->ev_cap];
    e->kind = kind;
    e->reason = reason;
    e->id = id;
    e->group_idx = group_idx;
    e->uid = uid;
    e->debug_pid = debug_pid;
    e->original_uid = original_uid;
    e->feature_idx = feature_idx;
    e->job_priority = job_priority;
    e->effective_priority = effective_priority;
    e->timestamp_ms = floor_div(t, 1000);
    e->device = device;
    e->time_us = t;
    e->model = model;
    h->ev_n++;
    h->ev_total++;
    if (h->ev_n == 1) signal_readable(h);
}

static void emit(vnpu_handle *h, int kind, int reason, const work_t *w, int64_t t) {
    emit_fields(h, kind, reason, w->id, w->group_idx, w->uid, w->debug_pid, w->original_uid,
                w->feature_idx, w->job_priority, w->effective_priority, w->device, w->model, t);
}

/* ---------------------------------------------------------------------------------------
 * Configs
 * ------------------------------------------------------------------------------------- */

static const vnpu_config *config_of(const vnpu_handle *h, int32_t uid) {
    int32_t i = map_get(&h->config_map, (int64_t)uid + 1);
    return i == NO_SLOT ? NULL : &h->configs[i];
}

static int permitted(const vnpu_handle *h, int32_t uid, int32_t original_uid) {
    const vnpu_config *c = config_of(h, uid);
    if (!c) c = &h->unknown;
    if (!c->has_direct_access) return 0;
    return original_uid == uid || c->can_attribute_other_uid;
}

int32_t effective(const vnpu_handle *h, int32_t uid, int32_t original_uid,
                         int32_t job_priority) {
    const vnpu_config *c = config_of(h, uid);
    if (!c) c = &h->unknown;
    if (original_uid != uid) {
        const vnpu_config *o = config_of(h, original_uid);
        if (o) c = o;
    }
    int32_t p = job_priority;
    if (p < c->min_priority) p = c->min_priority;
    if (p > c->max_priority) p = c->max_priority;
    return c->app_priority + p;
}

static int config_valid(const vnpu_config *c) {
    return c->uid >= 0 && c->min_priority >= VNPU_MIN_PRIORITY &&
           c->min_priority <= VNPU_MAX_PRIORITY && c->max_priority >= VNPU_MIN_PRIORITY &&
           c->max_priority <= VNPU_MAX_PRIORITY && c->min_priority <= c->max_priority &&
           c->app_priority >= VNPU_MIN_PRIORITY && c->app_priority <= VNPU_MAX_PRIORITY &&
           (c->has_direct_access == 0 || c->has_direct_access == 1) &&
           (c->can_attribute_other_uid == 0 || c->can_attribute_other_uid == 1);
}

/* ---------------------------------------------------------------------------------------
 * Heaps of queued work, keyed by (effective priority, id)
 * ------------------------------------------------------------------------------------- */


static int slot_less(const vnpu_handle *h, int32_t a, int32_t b) {
    return key_less(&h->pool[a], &h->pool[b]);
}

static void heap_set(vnpu_handle *h, device_t *d, int32_t pos, int32_t slot) {
    d->heap[pos] = slot;
    h->pool[slot].heap_pos = pos;
}

static void heap_up(vnpu_handle *h, device_t *d, int32_t pos) {
    int32_t slot = d->heap[pos];
    while (pos > 0) {
        int32_t parent = (pos - 1) / 2;
        if (!slot_less(h, slot, d->heap[parent])) break;
        heap_set(h, d, pos, d->heap[parent]);
        pos = parent;
    }
    heap_set(h, d, pos, slot);
}

static void heap_down(vnpu_handle *h, device_t *d, int32_t pos) {
    int32_t slot = d->heap[pos];
    for (;;) {
        int32_t child = 2 * pos + 1;
        if (child >= d->heap_n) break;
        if (child + 1 < d->heap_n && slot_less(h, d->heap[child + 1], d->heap[child])) child++;
        if (!slot_less(h, d->heap[child], slot)) break;
        heap_set(h, d, pos, d->heap[child]);
        pos = child;
    }
    heap_set(h, d, pos, slot);
}

static void heap_push(vnpu_handle *h, device_t *d, int32_t slot) {
    d->heap[d->heap_n] = slot;
    h->pool[slot].heap_pos = d->heap_n;
    d->heap_n++;
    heap_up(h, d, d->heap_n - 1);
}

static void heap_remove_at(vnpu_handle *h, device_t *d, int32_t pos) {
    d->heap_n--;
    if (pos == d->heap_n) return;
    heap_set(h, d, pos, d->heap[d->heap_n]);
    if (pos > 0 && slot_less(h, d->heap[pos], d->heap[(pos - 1) / 2]))
        heap_up(h, d, pos);
    else
        heap_down(h, d, pos);
}

static int32_t heap_pop(vnpu_handle *h, device_t *d) {
    int32_t top = d->heap[0];
    heap_remove_at(h, d, 0);
    return top;
}

static void heapify(vnpu_handle *h, device_t *d) {
    for (int32_t i = 0; i < d->heap_n; i++) h->pool[d->heap[i]].heap_pos = i;
    for (int32_t i = d->heap_n / 2 - 1; i >= 0; i--) heap_down(h, d, i);
}

/* The queued jobs best first, one at a time, without touching the heap: a frontier of
 * positions in d->heap grows from the root (the caller takes at most 64, so it stays small
 * and a linear scan finds its best). */
typedef struct {
    int32_t pos[VNPU_MAX_CHANNELS + 2];
    int32_t n;
} frontier_t;

static int32_t frontier_next(const vnpu_handle *h, const device_t *d, frontier_t *f) {
    if (f->n == 0) return NO_SLOT;
    int32_t bi = 0;
    for (int32_t i = 1; i < f->n; i++)
        if (slot_less(h, d->heap[f->pos[i]], d->heap[f->pos[bi]])) bi = i;
    int32_t pos = f->pos[bi];
    f->pos[bi] = f->pos[--f->n];
    for (int32_t c = 2 * pos + 1; c <= 2 * pos + 2; c++)
        if (c < d->heap_n) f->pos[f->n++] = c;
    return d->heap[pos];
}

/* ---------------------------------------------------------------------------------------
 * Device arithmetic
 * ------------------------------------------------------------------------------------- */

static int64_t clock_percent(const device_t *d, int32_t severity) {
    if (severity == 0) return 100;
    if (severity == VNPU_SEVERITY_SHUTDOWN) return 0;
    return d->spec.throttle_percent[severity - 1];
}

static int64_t speed_at(const device_t *d, int32_t severity) {
    return d->spec.clock_mhz * clock_percent(d, severity);
}

static int64_t speed(const device_t *d) { return speed_at(d, d->severity); }

static int32_t severity_of(const device_t *d, int64_t temp) {
    int32_t level = 0;
    for (int i = 0; i < VNPU_LEVELS; i++)
        if (temp >= d->spec.thresholds_mc[i]) level++;
    return level;
}

/* synced + ceil(remaining / speed), saturated at NEVER (where it means no event). */
static int64_t completion_us(const device_t *d, const work_t *w) {
    int64_t sp = speed(d);
    if (sp == 0) return NEVER;
    int64_t c = ceil_div(w->remaining_cc, sp);
    if (c >= NEVER - w->synced_us) return NEVER;
    return w->synced_us + c;
}


static void sync_work(device_t *d, work_t *w, int64_t t) {
    int64_t sp = speed(d);
    d->comp_stale = 1;
    int64_t dt = t - w->synced_us;
    if (sp > 0 && dt > 0) {
        if (dt > w->remaining_cc / sp)
            w->remaining_cc = 0;
        else
            w->remaining_cc -= dt * sp;
    }
    w->synced_us = t;
}

static int32_t running_count(const device_t *d) {
    int32_t n = 0;
    for (int32_t c = 0; c < d->nch; c++)
        if (d->ch[c] != NO_SLOT) n++;
    return n;
}

/* ---------------------------------------------------------------------------------------
 * Work lifecycle
 * ------------------------------------------------------------------------------------- */

static int32_t alloc_work(vnpu_handle *h) {
    int32_t slot;
    if (h->pool_free != NO_SLOT) {
        slot = h->pool_free;
        h->pool_free = h->pool[slot].next_free;
    } else {
        slot = h->pool_hw++;
    }
    h->live++;
    return slot;
}

static void free_work(vnpu_handle *h, int32_t slot) {
    h->pool[slot].next_free = h->pool_free;
    h->pool_free = slot;
    h->live--;
}

static void end_work(vnpu_handle *h, int32_t slot, int reason, int64_t t) {
    work_t *w = &h->pool[slot];
    device_t *d = &h->dev[w->device];
    fold(h, d, t); /* charge the run so far before the channel is freed */
    if (w->state == RUNNING) {
        sync_work(d, w, t);
        d->ch[w->channel] = NO_SLOT;
        if (d->fair) fair_stop(h, d, slot, t, 0);
    } else if (d->fair) {
        fair_remove(h, d, slot, t);
    } else {
        heap_remove_at(h, d, w->heap_pos);
    }
    map_del(&h->work_map, w->id);
    emit(h, VNPU_KIND_ENDED, reason, w, t);
    free_work(h, slot);
}

int cmp_ids(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* End the live work of device d (all of it, or only model `model`'s when model > 0), in
 * id order. */
static void end_all(vnpu_handle *h, device_t *d, int64_t model, int reason, int64_t t) {
    int64_t *ids = h->scratch;
    int32_t n = 0;
    for (int32_t c = 0; c < d->nch; c++) {
        int32_t s = d->ch[c];
        if (s != NO_SLOT && (model <= 0 || h->pool[s].model == model)) ids[n++] = h->pool[s].id;
    }
    for (int32_t i = 0; i < d->heap_n; i++) {
        int32_t s = d->heap[i];
        if (model <= 0 || h->pool[s].model == model) ids[n++] = h->pool[s].id;
    }
    if (d->fair) n = fair_queued_ids(h, d, model, ids, n);
    qsort(ids, (size_t)n, sizeof(int64_t), cmp_ids);
    for (int32_t i = 0; i < n; i++) {
        int32_t s = map_get(&h->work_map, ids[i]);
        if (s != NO_SLOT) end_work(h, s, reason, t);
    }
}

static void set_temperature(vnpu_handle *h, device_t *d, int64_t temp, int64_t t) {
    d->temp_mc = temp;
    if (temp > d->peak_temp_mc) d->peak_temp_mc = temp;
    int32_t sev = severity_of(d, temp);
    if (sev == d->severity) return;
    for (int32_t c = 0; c < d->nch; c++)
        if (d->ch[c] != NO_SLOT) sync_work(d, &h->pool[d->ch[c]], t);
    int64_t full = d->spec.clock_mhz * CENTI;
    int was = speed(d) < full;
    d->severity = sev;
    d->comp_stale = 1;
    int now = speed(d) < full;
    if (now && !was) {
        d->throttling = 1;
        d->throttled_since = t;
    } else if (was && !now && d->throttling) {
        d->throttled_us += t - d->throttled_since;
        d->throttling = 0;
    }
    if (sev == VNPU_SEVERITY_SHUTDOWN) end_all(h, d, 0, VNPU_END_FAILED, t);
}

static void thermal_tick(vnpu_handle *h, device_t *d, int64_t t) {
    int64_t ambient = d->spec.ambient_mc;
    int64_t temp = d->temp_mc + d->spec.heat_per_busy_channel_mc * running_count(d);
    int64_t delta = temp - ambient;
    if (delta != 0) {
        int64_t a = delta > 0 ? delta : -delta;
        int64_t c = d->spec.cooling_permille;
        int64_t step = (a / 1000) * c + ((a % 1000) * c) / 1000; /* a * c // 1000, exactly */
        if (step < 1) step = 1;
        int64_t m = min64(step, a);
        temp -= delta > 0 ? m : -m;
    }
    set_temperature(h, d, temp, t);
}

static void update_tick(device_t *d, int64_t t) {
    int active = running_count(d) > 0 || d->temp_mc != d->spec.ambient_mc;
    int64_t tick = d->spec.tick_us;
    if (!active) {
        d->has_tick = 0;
    } else if (!d->has_tick || d->next_tick_us <= t) {
        d->has_tick = 1;
        d->next_tick_us = (floor_div(t, tick) + 1) * tick;
    }
}

/* Queue one job at t on device `dn`; returns its id (a denied job ends FAILED at once). */
static int64_t arrive(vnpu_handle *h, int32_t dn, int64_t model, int32_t uid,
                      int32_t original_uid, int32_t job_priority, int64_t cost_cycles,
                      int32_t group_idx, int32_t feature_idx, int32_t debug_pid, int64_t t) {
    device_t *d = &h->dev[dn];
    int64_t id = h->next_work_id++;
    int32_t eff = effective(h, uid, original_uid, job_priority);
    emit_fields(h, VNPU_KIND_REQUESTED, VNPU_NO_REASON, id, group_idx, uid, debug_pid,
                original_uid, feature_idx, job_priority, eff, dn, model, t);
    if (!permitted(h, uid, original_uid) || d->severity == VNPU_SEVERITY_SHUTDOWN ||
        h->live >= h->max_live) {
        emit_fields(h, VNPU_KIND_ENDED, VNPU_END_FAILED, id, group_idx, uid, debug_pid,
                    original_uid, feature_idx, job_priority, eff, dn, model, t);
        return id;
    }
    int32_t slot = alloc_work(h);
    work_t *w = &h->pool[slot];
    w->id = id;
    w->model = model;
    w->remaining_cc = cost_cycles * CENTI;
    w->run_start_us = 0;
    w->synced_us = 0;
    w->uid = uid;
    w->original_uid = original_uid;
    w->job_priority = job_priority;
    w->effective_priority = eff;
    w->debug_pid = debug_pid;
    w->group_idx = group_idx;
    w->feature_idx = feature_idx;
    w->device = dn;
    w->channel = -1;
    w->state = QUEUED;
    w->started_before = 0;
    map_put(&h->work_map, id, slot);
    if (d->fair)
        fair_enqueue(h, d, slot, t);
    else
        heap_push(h, d, slot);
    d->dirty = 1;
    return id;
}

static void fire(vnpu_handle *h, int32_t dn, gen_t *g, int64_t t) {
    for (int32_t i = 0; i < g->burst; i++)
        arrive(h, dn, g->model, g->uid, g->original_uid, g->job_priority, g->cost_cycles,
               g->group_idx, g->feature_idx, g->debug_pid, t);
    g->remaining--;
    g->next_us += g->period_us;
}

static void dispatch(vnpu_handle *h, device_t *d, int64_t t) {
    for (int32_t c = 0; c < d->nch; c++) {
        if (d->ch[c] != NO_SLOT) continue;
        int32_t s;
        if (d->fair) {
            s = fair_pick(h, d, t);
            if (s == NO_SLOT) break;
        } else {
            if (d->heap_n == 0) break;
            s = heap_pop(h, d);
        }
        work_t *w = &h->pool[s];
        w->state = RUNNING;
        w->channel = c;
        w->run_start_us = w->synced_us = t;
        d->ch[c] = s;
        d->comp_stale = 1;
        if (d->fair) fair_start(h, d, s, t);
        int reason = w->started_before ? VNPU_START_RESUMED : VNPU_START_INITIAL;
        w->started_before = 1;
        emit(h, VNPU_KIND_STARTED, reason, w, t);
    }
}

static void pause_work(vnpu_handle *h, device_t *d, int32_t s, int64_t t) {
    work_t *w = &h->pool[s];
    fold(h, d, t);
    sync_work(d, w, t);
    d->ch[w->channel] = NO_SLOT;
    w->state = QUEUED;
    w->channel = -1;
    if (d->fair)
        fair_stop(h, d, s, t, 1);
    else
        heap_push(h, d, s);
    emit(h, VNPU_KIND_ENDED, VNPU_END_PAUSED, w, t);
}

/* The running jobs to pause at their next slice boundary, by channel: the waiting jobs
 * best first, less the ones the free channels will take, pair with the running ones
 * least important first while the waiting one's effective priority is strictly lower. */
static int32_t marked(const vnpu_handle *h, const device_t *d, int32_t *out) {
    int32_t run[VNPU_MAX_CHANNELS];
    int32_t nrun = 0, worst = NO_SLOT;
    if (d->heap_n == 0) return 0;
    for (int32_t c = 0; c < d->nch; c++) {
        int32_t s = d->ch[c];
        if (s == NO_SLOT) continue;
        run[nrun++] = s;
        if (worst == NO_SLOT || slot_less(h, worst, s)) worst = s;
    }
    if (nrun == 0) return 0;
    if (h->pool[d->heap[0]].effective_priority >= h->pool[worst].effective_priority) return 0;
    /* worst first: key descending (insertion sort; nrun <= 64) */
    for (int32_t i = 1; i < nrun; i++) {
        int32_t s = run[i], j = i;
        while (j > 0 && slot_less(h, run[j - 1], s)) {
            run[j] = run[j - 1];
            j--;
        }
        run[j] = s;
    }
    frontier_t f;
    f.n = 1;
    f.pos[0] = 0;
    for (int32_t free = d->nch - nrun; free > 0; free--)
        if (frontier_next(h, d, &f) == NO_SLOT) return 0;
    int32_t m = 0;
    for (int32_t i = 0; i < nrun; i++) {
        int32_t waiting = frontier_next(h, d, &f);
        if (waiting == NO_SLOT) break;
        if (h->pool[waiting].effective_priority >= h->pool[run[i]].effective_priority) break;
        out[m++] = run[i];
    }
    sort_by_channel(h, out, m);
    return m;
}

static int64_t next_event(const vnpu_handle *h, device_t *d) {
    int64_t t = NEVER;
    int32_t mk[VNPU_MAX_CHANNELS];
    if (d->dirty) t = h->clock_us;
    if (d->comp_stale) {
        d->comp_min = NEVER;
        for (int32_t c = 0; c < d->nch; c++)
            if (d->ch[c] != NO_SLOT)
                d->comp_min = min64(d->comp_min, completion_us(d, &h->pool[d->ch[c]]));
        d->comp_stale = 0;
    }
    t = min64(t, d->comp_min);
    if (d->fair) {
        t = min64(t, fair_next_pause(h, d, h->clock_us));
    } else {
        int32_t m = marked(h, d, mk);
        for (int32_t i = 0; i < m; i++)
            t = min64(t, boundary_us(d, &h->pool[mk[i]], h->clock_us));
    }
    if (d->gen_stale) {
        d->gen_min = NEVER;
        for (int32_t i = 0; i < d->ngen; i++) d->gen_min = min64(d->gen_min, d->gens[i].next_us);
        d->gen_stale = 0;
    }
    t = min64(t, d->gen_min);
    if (d->has_tick) t = min64(t, d->next_tick_us);
    return t;
}

static void step(vnpu_handle *h, int32_t dn, int64_t t) {
    device_t *d = &h->dev[dn];
    int32_t mk[VNPU_MAX_CHANNELS];
    d->dirty = 0;
    if (d->has_tick && d->next_tick_us == t) thermal_tick(h, d, t);
    for (int32_t c = 0; c < d->nch; c++) {
        int32_t s = d->ch[c];
        if (s != NO_SLOT && completion_us(d, &h->pool[s]) <= t)
            end_work(h, s, VNPU_END_COMPLETED, t);
    }
    int32_t n = d->ngen, kept = 0;
    for (int32_t i = 0; i < n; i++) {
        if (d->gens[i].next_us == t) {
            fire(h, dn, &d->gens[i], t);
            d->gen_stale = 1;
        }
    }
    for (int32_t i = 0; i < n; i++)
        if (d->gens[i].remaining != 0) d->gens[kept++] = d->gens[i];
    d->ngen = kept;
    if (d->fair) {
        int32_t m = fair_victims(h, d, t, mk);
        for (int32_t i = 0; i < m; i++) pause_work(h, d, mk[i], t);
    } else {
        int32_t m = marked(h, d, mk);
        for (int32_t i = 0; i < m; i++)
            if (boundary_us(d, &h->pool[mk[i]], t) == t) pause_work(h, d, mk[i], t);
    }
    dispatch(h, d, t);
    update_tick(d, t);
}

/* The earliest event point of any device that is <= target (lower number on ties). */
static int32_t pick(vnpu_handle *h, int64_t target, int64_t *out_t) {
    int32_t best = -1;
    int64_t bt = NEVER;
    for (int32_t i = 0; i < h->ndev; i++) {
        int64_t t = next_event(h, &h->dev[i]);
        if (t < NEVER && t <= target && (best < 0 || t < bt)) {
            best = i;
            bt = t;
        }
    }
    *out_t = bt;
    return best;
}

/* advance_to: event points up to target; with stop_when_full, VNPU_E_AGAIN at an
 * event-point boundary once the queue holds ev_soft events. */
static int advance_locked(vnpu_handle *h, int64_t target, int stop_when_full) {
    int64_t t;
    int32_t dn;
    while ((dn = pick(h, target, &t)) >= 0) {
        h->clock_us = t;
        step(h, dn, t);
        if (stop_when_full && h->ev_n >= h->ev_soft) return VNPU_E_AGAIN;
    }
    if (target > h->clock_us) h->clock_us = target;
    return VNPU_OK;
}

static int idle_locked(const vnpu_handle *h) {
    if (h->live != 0) return 0;
    for (int32_t i = 0; i < h->ndev; i++)
        if (h->dev[i].ngen != 0 || h->dev[i].dirty) return 0;
    return 1;
}

static int64_t next_event_all(vnpu_handle *h) {
    int64_t t = NEVER;
    for (int32_t i = 0; i < h->ndev; i++) t = min64(t, next_event(h, &h->dev[i]));
    return t;
}

/* ---------------------------------------------------------------------------------------
 * Locking, and the real clock's catch-up around every call
 * ------------------------------------------------------------------------------------- */

/* The real clock's catch-up: the event points due by `target`, unless the event queue is
 * full. Then the device clock lags wall time until the reader drains (calls never block). */
static void catch_up(vnpu_handle *h, int64_t target) {
    if (h->ev_n < h->ev_soft) advance_locked(h, target, 1);
}

static int enter(vnpu_handle *h) {
    if (!h) return VNPU_E_INVAL;
    pthread_mutex_lock(&h->mu);
    if (h->closed || h->closing) {
        pthread_mutex_unlock(&h->mu);
        return VNPU_E_CLOSED;
    }
    if (h->real) catch_up(h, mono_us());
    return VNPU_OK;
}

/* Leave a call. On the real clock a call's own event point (the device it made dirty)
 * happens now, in the caller, and workers whose deadline moved earlier are woken. */
static int leave(vnpu_handle *h, int rc) {
    if (h->real) {
        catch_up(h, h->clock_us);
        for (int32_t i = 0; i < h->ndev; i++) {
            device_t *d = &h->dev[i];
            if (next_event(h, d) < d->sleep_until) pthread_cond_signal(&d->wake);
        }
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

static int leave_quiet(vnpu_handle *h, int rc) {
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* One device's worker: sleep until the device's next event point (or a signal), then
 * perform every event point due by now, in the global order; wait for space whenever the
 * event queue is full, so a reader that does not drain holds the devices up. */
static void *worker_main(void *p) {
    worker_arg_t *arg = p;
    vnpu_handle *h = arg->h;
    device_t *self = &h->dev[arg->number];
    pthread_mutex_lock(&h->mu);
    while (!h->closing) {
        int64_t now = mono_us(), t;
        int32_t dn;
        int caught_up = 0;
        while (!h->closing) {
            if (h->ev_n >= h->ev_soft) {
                h->stalls++;
                h->space_waiters++;
                while (h->ev_n >= h->ev_soft && !h->closing)
                    pthread_cond_wait(&h->space, &h->mu);
                h->space_waiters--;
                continue;
            }
            if ((dn = pick(h, now, &t)) < 0) {
                caught_up = 1;
                break;
            }
            h->clock_us = t;
            step(h, dn, t);
        }
        if (h->closing) break;
        if (caught_up && now > h->clock_us) h->clock_us = now;
        int64_t deadline = next_event(h, self);
        self->sleep_until = deadline;
        h->sleeping++;
        if (deadline >= NEVER) {
            pthread_cond_wait(&self->wake, &h->mu);
        } else {
            struct timespec ts;
            ts.tv_sec = (time_t)(deadline / 1000000);
            ts.tv_nsec = (long)(deadline % 1000000) * 1000;
            pthread_cond_timedwait(&self->wake, &h->mu, &ts);
        }
        h->sleeping--;
        self->sleep_until = INT64_MIN;
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* ---------------------------------------------------------------------------------------
 * Create, close, destroy
 * ------------------------------------------------------------------------------------- */

static int spec_valid(const vnpu_spec *s) {
    if (s->channels < 1 || s->channels > VNPU_MAX_CHANNELS) return 0;
    if (s->sram_bytes < 1 || s->sram_bytes > VNPU_MAX_SRAM_BYTES) return 0;
    if (s->weight_memory_bytes < 1) return 0;
    if (s->clock_mhz < 1 || s->clock_mhz > 1000000) return 0;
    if (s->slice_us < 1 || s->slice_us > VNPU_MAX_SPAN_US) return 0;
    if (s->tick_us < 1 || s->tick_us > VNPU_MAX_SPAN_US) return 0;
    if (s->ambient_mc < -VNPU_MAX_SPEC_MC || s->ambient_mc > VNPU_MAX_SPEC_MC) return 0;
    if (s->heat_per_busy_channel_mc < 0 || s->heat_per_busy_channel_mc > VNPU_MAX_SPEC_MC)
        return 0;
    if (s->cooling_permille < 1 || s->cooling_permille > 1000) return 0;
    /* A zeroed tail (strict, no bands, no floor) is the device before bands existed. */
    if (s->scheduler != VNPU_SCHED_STRICT && s->scheduler != VNPU_SCHED_FAIR) return 0;
    if (s->nbands < 0 || s->nbands > VNPU_MAX_BANDS) return 0;
    if (s->nbands > 0 && s->band_first[0] != 0) return 0;
    for (int32_t b = 1; b < s->nbands; b++)
        if (s->band_first[b] <= s->band_first[b - 1] ||
            s->band_first[b] > 2 * VNPU_MAX_PRIORITY)
            return 0;
    if (s->floor_percent < 0 || s->floor_percent > VNPU_MAX_FLOOR_PERCENT) return 0;
    if (s->floor_window_us < (s->floor_percent ? 1 : 0) ||
        s->floor_window_us > VNPU_MAX_FLOOR_WINDOW_US)
        return 0;
    for (int i = 0; i < VNPU_LEVELS; i++) {
        if (s->thresholds_mc[i] < -VNPU_MAX_SPEC_MC || s->thresholds_mc[i] > VNPU_MAX_SPEC_MC)
            return 0;
        if (i > 0 && s->thresholds_mc[i] <= s->thresholds_mc[i - 1]) return 0;
        if (s->throttle_percent[i] < 1 || s->throttle_percent[i] > 100) return 0;
    }
    return s->thresholds_mc[0] > s->ambient_mc;
}

static void free_handle(vnpu_handle *h) {
    for (int32_t i = 0; i < VNPU_MAX_DEVICES; i++) {
        free(h->dev[i].heap);
        free(h->dev[i].gens);
        if (h->dev[i].wake_ready) pthread_cond_destroy(&h->dev[i].wake);
    }
    free(h->pool);
    free(h->work_map.tab);
    free(h->flowpool);
    free(h->flow_map.tab);
    free(h->scratch);
    free(h->models);
    free(h->model_map.tab);
    free(h->configs);
    free(h->config_map.tab);
    free(h->ev);
    if (h->efd >= 0) close(h->efd);
    if (h->space_ready) pthread_cond_destroy(&h->space);
    if (h->mu_ready) pthread_mutex_destroy(&h->mu);
    free(h);
}

static void stop_workers(vnpu_handle *h) {
    pthread_mutex_lock(&h->mu);
    h->closing = 1;
    pthread_cond_broadcast(&h->space);
    for (int32_t i = 0; i < h->ndev; i++)
        if (h->dev[i].wake_ready) pthread_cond_broadcast(&h->dev[i].wake);
    pthread_mutex_unlock(&h->mu);
    for (int32_t i = 0; i < h->ndev; i++) {
        if (h->dev[i].thread_started) {
            pthread_join(h->dev[i].thread, NULL);
            h->dev[i].thread_started = 0;
        }
    }
    pthread_mutex_lock(&h->mu);
    h->closed = 1;
    pthread_mutex_unlock(&h->mu);
}

int vnpu_create(const vnpu_spec *specs, int32_t ndevices, int32_t max_live_work,
                int32_t max_models, int32_t event_capacity, int32_t clock_mode,
                const vnpu_config *unknown, vnpu_handle **out) {
    if (!specs || !unknown || !out) return VNPU_E_INVAL;
    *out = NULL;
    if (ndevices < 1 || ndevices > VNPU_MAX_DEVICES) return VNPU_E_INVAL;
    if (max_live_work < 1 || max_live_work > VNPU_MAX_LIVE_WORK) return VNPU_E_INVAL;
    if (max_models < 1 || max_models > VNPU_MAX_MODELS) return VNPU_E_INVAL;
    if (event_capacity < 1 || event_capacity > VNPU_MAX_EVENT_CAPACITY) return VNPU_E_INVAL;
    if (clock_mode != VNPU_CLOCK_VIRTUAL && clock_mode != VNPU_CLOCK_REAL) return VNPU_E_INVAL;
    if (!config_valid(unknown)) return VNPU_E_INVAL;
    for (int32_t i = 0; i < ndevices; i++)
        if (!spec_valid(&specs[i])) return VNPU_E_INVAL;

    vnpu_handle *h = calloc(1, sizeof *h);
    if (!h) return VNPU_E_NOMEM;
    h->efd = -1;
    if (pthread_mutex_init(&h->mu, NULL) != 0) goto nomem;
    h->mu_ready = 1;
    if (pthread_cond_init(&h->space, NULL) != 0) goto nomem;
    h->space_ready = 1;
    h->real = clock_mode == VNPU_CLOCK_REAL;
    h->ndev = ndevices;
    h->max_live = max_live_work;
    h->max_models = max_models;
    h->pool_free = NO_SLOT;
    h->model_free = NO_SLOT;
    h->next_work_id = 1;
    h->next_model_id = 1;
    h->unknown = *unknown;
    h->ev_soft = event_capacity;
    h->ev_cap = (int64_t)event_capacity + 256;
    h->pool = calloc((size_t)max_live_work, sizeof(work_t));
    h->scratch = calloc((size_t)max_live_work, sizeof(int64_t));
    h->models = calloc((size_t)max_models, sizeof(model_t));
    h->ev = malloc((size_t)h->ev_cap * sizeof(vnpu_event));
    if (!h->pool || !h->scratch || !h->models || !h->ev) goto nomem;
    if (map_init(&h->work_map, max_live_work) != VNPU_OK) goto nomem;
    if (map_init(&h->model_map, max_models) != VNPU_OK) goto nomem;
    if (map_init(&h->config_map, 1) != VNPU_OK) goto nomem;
    h->flow_free = NO_SLOT;
    int any_fair = 0;
    for (int32_t i = 0; i < ndevices; i++) any_fair |= specs[i].scheduler == VNPU_SCHED_FAIR;
    if (any_fair) {
        /* A flow holds live work, so max_live_work of them, twice while flows are rebuilt,
         * and each device keeps a few without for reuse. */
        int64_t flows =
            2 * (int64_t)max_live_work + 1 + VNPU_MAX_DEVICES * (VNPU_FLOW_CACHE + 1);
        h->flowpool = calloc((size_t)flows, sizeof(flow_t));
        if (!h->flowpool || map_init(&h->flow_map, flows) != VNPU_OK) goto nomem;
    }

    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0) goto nomem;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    for (int32_t i = 0; i < ndevices; i++) {
        device_t *d = &h->dev[i];
        d->spec = specs[i];
        if (d->spec.nbands == 0) {
            d->spec.nbands = 1;
            d->spec.band_first[0] = 0;
        }
        d->temp_mc = d->peak_temp_mc = specs[i].ambient_mc;
        d->nch = specs[i].channels;
        d->fair = specs[i].scheduler == VNPU_SCHED_FAIR;
        d->flows = NO_SLOT;
        d->checked_us = -1;
        for (int32_t c = 0; c < VNPU_MAX_CHANNELS; c++) d->ch[c] = NO_SLOT;
        d->heap = calloc((size_t)max_live_work, sizeof(int32_t));
        d->sleep_until = INT64_MIN;
        d->comp_stale = d->gen_stale = 1;
        if (!d->heap || pthread_cond_init(&d->wake, &attr) != 0) {
            pthread_condattr_destroy(&attr);
            goto nomem;
        }
        d->wake_ready = 1;
    }
    pthread_condattr_destroy(&attr);

    if (h->real) {
        h->clock_us = mono_us();
        h->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (h->efd < 0) goto nomem;
        for (int32_t i = 0; i < ndevices; i++) {
            device_t *d = &h->dev[i];
            d->arg.h = h;
            d->arg.number = i;
            if (pthread_create(&d->thread, NULL, worker_main, &d->arg) != 0) {
                stop_workers(h);
                goto nomem;
            }
            d->thread_started = 1;
        }
    }
    *out = h;
    return VNPU_OK;
nomem:
    free_handle(h);
    return VNPU_E_NOMEM;
}

int vnpu_close(vnpu_handle *h) {
    if (!h) return VNPU_E_INVAL;
    stop_workers(h);
    return VNPU_OK;
}

int vnpu_destroy(vnpu_handle *h) {
    if (!h) return VNPU_E_INVAL;
    stop_workers(h);
    free_handle(h);
    return VNPU_OK;
}

/* ---------------------------------------------------------------------------------------
 * Calls
 * ------------------------------------------------------------------------------------- */

int vnpu_configure(vnpu_handle *h, const vnpu_config *configs, int32_t n) {
    if (n < 0 || (n > 0 && !configs)) return VNPU_E_INVAL;
    for (int32_t i = 0; i < n; i++)
        if (!config_valid(&configs[i])) return VNPU_E_INVAL;
    vnpu_config *copy = malloc((size_t)(n > 0 ? n : 1) * sizeof(vnpu_config));
    map_t map;
    if (!copy) return VNPU_E_NOMEM;
    if (map_init(&map, n > 0 ? n : 1) != VNPU_OK) {
        free(copy);
        return VNPU_E_NOMEM;
    }
    for (int32_t i = 0; i < n; i++) {
        if (map_get(&map, (int64_t)configs[i].uid + 1) != NO_SLOT) {
            free(copy);
            free(map.tab);
            return VNPU_E_INVAL; /* two configs for one uid */
        }
        copy[i] = configs[i];
        map_put(&map, (int64_t)configs[i].uid + 1, i);
    }
    int rc = enter(h);
    if (rc != VNPU_OK) {
        free(copy);
        free(map.tab);
        return rc;
    }
    free(h->configs);
    free(h->config_map.tab);
    h->configs = copy;
    h->nconfigs = n;
    h->config_map = map;
    for (int32_t i = 0; i < h->ndev; i++) {
        device_t *d = &h->dev[i];
        if (d->fair) {
            fair_rerank(h, d, i, h->clock_us);
            d->dirty = 1;
            continue;
        }
        for (int32_t c = 0; c < d->nch; c++) {
            if (d->ch[c] == NO_SLOT) continue;
            work_t *w = &h->pool[d->ch[c]];
            w->effective_priority = effective(h, w->uid, w->original_uid, w->job_priority);
        }
        for (int32_t k = 0; k < d->heap_n; k++) {
            work_t *w = &h->pool[d->heap[k]];
            w->effective_priority = effective(h, w->uid, w->original_uid, w->job_priority);
        }
        heapify(h, d);
        d->dirty = 1;
    }
    return leave(h, VNPU_OK);
}

int vnpu_load_model(vnpu_handle *h, int32_t device, int64_t weight_bytes, int64_t sram_bytes,
                    int64_t *out_model) {
    if (!out_model) return VNPU_E_INVAL;
    int rc = enter(h);
    if (rc != VNPU_OK) return rc;
    if (device < 0 || device >= h->ndev) return leave_quiet(h, VNPU_E_NODEV);
    if (weight_bytes < 0 || sram_bytes < 0) return leave_quiet(h, VNPU_E_INVAL);
    device_t *d = &h->dev[device];
    if (h->nmodels >= h->max_models) return leave_quiet(h, VNPU_E_NOMEM);
    if (weight_bytes > d->spec.weight_memory_bytes - d->weight_used)
        return leave_quiet(h, VNPU_E_NOMEM);
    if (sram_bytes > d->spec.sram_bytes) return leave_quiet(h, VNPU_E_NOMEM);
    int32_t slot;
    if (h->model_free != NO_SLOT) {
        slot = h->model_free;
        h->model_free = h->models[slot].next_free;
    } else {
        slot = h->model_hw++;
    }
    model_t *m = &h->models[slot];
    m->id = h->next_model_id++;
    m->device = device;
    m->weight_bytes = weight_bytes;
    m->sram_bytes = sram_bytes;
    map_put(&h->model_map, m->id, slot);
    h->nmodels++;
    d->weight_used += weight_bytes;
    d->models++;
    *out_model = m->id;
    return leave(h, VNPU_OK);
}

int vnpu_unload_model(vnpu_handle *h, int64_t model) {
    int rc = enter(h);
    if (rc != VNPU_OK) return rc;
    int32_t slot = map_get(&h->model_map, model);
    if (slot == NO_SLOT) return leave_quiet(h, VNPU_E_NOMODEL);
    model_t *m = &h->models[slot];
    device_t *d = &h->dev[m->device];
    end_all(h, d, model, VNPU_END_CANCELLED_SYSTEM, h->clock_us);
    int32_t kept = 0;
    for (int32_t i = 0; i < d->ngen; i++)
        if (d->gens[i].model != model) d->gens[kept++] = d->gens[i];
    d->ngen = kept;
    d->gen_stale = 1;
    d->weight_used -= m->weight_bytes;
    d->models--;
    map_del(&h->model_map, model);
    m->next_free = h->model_free;
    h->model_free = slot;
    h->nmodels--;
    d->dirty = 1;
    return leave(h, VNPU_OK);
}

static int job_args_valid(int32_t uid, int32_t original_uid, int32_t job_priority,
                          int64_t cost_cycles, int32_t group_idx, int32_t feature_idx) {
    return uid >= 0 && original_uid >= 0 && job_priority >= VNPU_MIN_PRIORITY &&
           job_priority <= VNPU_MAX_PRIORITY && cost_cycles >= 1 &&
           cost_cycles <= VNPU_MAX_COST_CYCLES && group_idx >= -1 && feature_idx >= -1;
}

int vnpu_submit(vnpu_handle *h, int64_t model, int32_t uid, int32_t original_uid,
                int32_t job_priority, int64_t cost_cycles, int32_t group_idx,
                int32_t feature_idx, int32_t debug_pid, int64_t *out_id) {
    if (!out_id || !job_args_valid(uid, original_uid, job_priority, cost_cycles, group_idx,
                                   feature_idx))
        return VNPU_E_INVAL;
    int rc = enter(h);
    if (rc != VNPU_OK) return rc;
    int32_t slot = map_get(&h->model_map, model);
    if (slot == NO_SLOT) return leave_quiet(h, VNPU_E_NOMODEL);
    *out_id = arrive(h, h->models[slot].device, model, uid, original_uid, job_priority,
                     cost_cycles, group_idx, feature_idx, debug_pid, h->clock_us);
    return leave(h, VNPU_OK);
}

int vnpu_add_periodic(vnpu_handle *h, int64_t model, int32_t uid, int32_t original_uid,
                      int32_t job_priority, int64_t cost_cycles, int64_t period_us,
                      int64_t start_us, int32_t count, int32_t burst, int32_t group_idx,
                      int32_t feature_idx, int32_t debug_pid) {
    if (!job_args_valid(uid, original_uid, job_priority, cost_cycles, group_idx, feature_idx))
        return VNPU_E_INVAL;
    if (period_us < 1 || period_us > VNPU_MAX_SPAN_US || start_us > VNPU_MAX_SPAN_US ||
        count < 1 || burst < 1 || burst > VNPU_MAX_BURST)
        return VNPU_E_INVAL;
    int rc = enter(h);
    if (rc != VNPU_OK) return rc;
    int32_t slot = map_get(&h->model_map, model);
    if (slot == NO_SLOT) return leave_quiet(h, VNPU_E_NOMODEL);
    if (start_us < h->clock_us) {
        /* On the real clock the caller's "now" has passed by the time we run. */
        if (!h->real) return leave_quiet(h, VNPU_E_INVAL);
        start_us = h->clock_us;
    }
    device_t *d = &h->dev[h->models[slot].device];
    if (d->ngen == d->gen_cap) {
        int32_t cap = d->gen_cap ? d->gen_cap * 2 : 8;
        gen_t *bigger = realloc(d->gens, (size_t)cap * sizeof(gen_t));
        if (!bigger) return leave_quiet(h, VNPU_E_NOMEM);
        d->gens = bigger;
        d->gen_cap = cap;
    }
    gen_t *g = &d->gens[d->ngen++];
    g->model = model;
    g->cost_cycles = cost_cycles;
    g->period_us = period_us;
    g->next_us = start_us;
    g->uid = uid;
    g->original_uid = original_uid;
    g->job_priority = job_priority;
    g->remaining = count;
    g->burst = burst;
    g->group_idx = group_idx;
    g->feature_idx = feature_idx;
    g->debug_pid = debug_pid;
    d->gen_stale = 1;
    d->dirty = 1;
    return leave(h, VNPU_OK);
}

int vnpu_end_work(vnpu_handle *h, int64_t work_id, int32_t reason) {
    if (reason < VNPU_END_CANCELLED_USER || reason > VNPU_END_COMPLETED) return VNPU_E_INVAL;
    int rc = enter(h);
    if (rc != VNPU_OK) return rc;
    int32_t slot = map_get(&h->work_map, work_id);
    if (slot == NO_SLOT) return leave_quiet(h, VNPU_E_NOWORK);
    device_t *d = &h->dev[h->pool[slot].device];
    end_work(h, slot, reason, h->clock_us);
    d->dirty = 1;
    return leave(h, VNPU_OK);
}

int vnpu_add_heat(vnpu_handle *h, int32_t device, int64_t millicelsius) {
    if (millicelsius < -VNPU_MAX_HEAT_STEP_MC || millicelsius > VNPU_MAX_HEAT_STEP_MC)
        return VNPU_E_INVAL;
    int rc = enter(h);
    if (rc != VNPU_OK) return rc;
    if (device < 0 || device >= h->ndev) return leave_quiet(h, VNPU_E_NODEV);
    device_t *d = &h->dev[device];
    int64_t temp = d->temp_mc;
    if ((millicelsius > 0 && temp > INT64_MAX / 2) || (millicelsius < 0 && temp < INT64_MIN / 2))
        return leave_quiet(h, VNPU_E_INVAL);
    set_temperature(h, d, temp + millicelsius, h->clock_us);
    d->dirty = 1;
    return leave(h, VNPU_OK);
}

int vnpu_advance_to(vnpu_handle *h, int64_t target_us) {
    if (target_us >= NEVER) return VNPU_E_INVAL;
    int rc = enter(h);
    if (rc != VNPU_OK) return rc;
    if (h->real) return leave_quiet(h, VNPU_E_INVAL);
    return leave_quiet(h, advance_locked(h, target_us, 1));
}

int vnpu_now(vnpu_handle *h, int64_t *out_us) {
    if (!out_us) return VNPU_E_INVAL;
    int rc = enter(h);
    if (rc != VNPU_OK) return rc;
    *out_us = h->clock_us;
    return leave_quiet(h, VNPU_OK);
}

int vnpu_next_event(vnpu_handle *h, int64_t *out_us) {
    if (!out_us) return VNPU_E_INVAL;
    int rc = enter(h);
    if (rc != VNPU_OK) return rc;
    *out_us = next_event_all(h);
    return leave_quiet(h, VNPU_OK);
}

int vnpu_idle(vnpu_handle *h, int32_t *out_idle) {
    if (!out_idle) return VNPU_E_INVAL;
    int rc = enter(h);
    if (rc != VNPU_OK) return rc;
    *out_idle = idle_locked(h);
    return leave_quiet(h, VNPU_OK);
}

int vnpu_status(vnpu_handle *h, int32_t device, vnpu_reading *out) {
    if (!out) return VNPU_E_INVAL;
    int rc = enter(h);
    if (rc != VNPU_OK) return rc;
    if (device < 0 || device >= h->ndev) return leave_quiet(h, VNPU_E_NODEV);
    const device_t *d = &h->dev[device];
    memset(out, 0, sizeof *out);
    out->now_us = h->clock_us;
    out->weight_memory_bytes = d->spec.weight_memory_bytes;
    out->weight_memory_used_bytes = d->weight_used;
    out->models_loaded = d->models;
    out->queue_depth = d->fair ? d->queued : d->heap_n;
    out->temperature_mc = d->temp_mc;
    out->peak_temperature_mc = d->peak_temp_mc;
    out->severity = d->severity;
    out->throttled_us = d->throttled_us + (d->throttling ? h->clock_us - d->throttled_since : 0);
    out->shutdown = d->severity == VNPU_SEVERITY_SHUTDOWN;
    out->channels = d->nch;
    for (int32_t c = 0; c < VNPU_MAX_CHANNELS; c++) out->running[c] = -1;
    for (int32_t c = 0; c < d->nch; c++) {
        int32_t s = d->ch[c];
        if (s == NO_SLOT) continue;
        const work_t *w = &h->pool[s];
        out->running[c] = w->id;
        int32_t ms = map_get(&h->model_map, w->model);
        if (ms != NO_SLOT) out->sram_used_bytes += h->models[ms].sram_bytes;
    }
    return leave_quiet(h, VNPU_OK);
}

int vnpu_stats(vnpu_handle *h, vnpu_counters *out) {
    if (!out) return VNPU_E_INVAL;
    int rc = enter(h);
    if (rc != VNPU_OK) return rc;
    out->live_work = h->live;
    out->models = h->nmodels;
    out->generators = 0;
    for (int32_t i = 0; i < h->ndev; i++) out->generators += h->dev[i].ngen;
    out->pending_events = h->ev_n;
    out->events_total = h->ev_total;
    out->dropped_events = h->ev_dropped;
    out->stalls = h->stalls;
    out->next_work_id = h->next_work_id;
    out->sleeping = h->sleeping;
    return leave_quiet(h, VNPU_OK);
}

static void after_drain(vnpu_handle *h) {
    if (h->ev_n < h->ev_soft && h->space_waiters) pthread_cond_broadcast(&h->space);
    if (h->ev_n == 0 && h->efd >= 0 && h->efd_armed) {
        uint64_t v;
        ssize_t r = read(h->efd, &v, sizeof v);
        (void)r;
        h->efd_armed = 0;
    }
}

static int32_t drain_locked(vnpu_handle *h, vnpu_event *buf, int32_t cap) {
    int64_t n = min64(cap, h->ev_n);
    int64_t first = min64(n, h->ev_cap - h->ev_head);
    memcpy(buf, h->ev + h->ev_head, (size_t)first * sizeof(vnpu_event));
    memcpy(buf + first, h->ev, (size_t)(n - first) * sizeof(vnpu_event));
    h->ev_head = (h->ev_head + n) % h->ev_cap;
    h->ev_n -= n;
    if (h->ev_n == 0) h->ev_head = 0;
    after_drain(h);
    return (int32_t)n;
}

int vnpu_drain(vnpu_handle *h, vnpu_event *buf, int32_t cap, int32_t *out_n) {
    if (!out_n || cap < 0 || (cap > 0 && !buf)) return VNPU_E_INVAL;
    *out_n = 0;
    if (!h) return VNPU_E_INVAL;
    pthread_mutex_lock(&h->mu);
    if (h->closed || h->closing) return leave_quiet(h, VNPU_E_CLOSED);
    *out_n = drain_locked(h, buf, cap);
    return leave_quiet(h, VNPU_OK);
}

int vnpu_fileno(vnpu_handle *h, int32_t *out_fd) {
    if (!out_fd) return VNPU_E_INVAL;
    int rc = enter(h);
    if (rc != VNPU_OK) return rc;
    if (h->efd < 0) return leave_quiet(h, VNPU_E_INVAL);
    *out_fd = h->efd;
    return leave_quiet(h, VNPU_OK);
}

int vnpu_monotonic_us(int64_t *out_us) {
    if (!out_us) return VNPU_E_INVAL;
    *out_us = mono_us();
    return VNPU_OK;
}

int vnpu_bench_single(vnpu_handle *h, int64_t model, int64_t n, int32_t uid,
                      int64_t cost_cycles, int32_t job_priority, vnpu_event *scratch,
                      int32_t scratch_cap, int64_t *out_events) {
    if (!out_events || n < 0 || !scratch || scratch_cap < 1 ||
        !job_args_valid(uid, uid, job_priority, cost_cycles, -1, -1))
        return VNPU_E_INVAL;
    *out_events = 0;
    int rc = enter(h);
    if (rc != VNPU_OK) return rc;
    if (h->real) return leave_quiet(h, VNPU_E_INVAL);
    int32_t slot = map_get(&h->model_map, model);
    if (slot == NO_SLOT) return leave_quiet(h, VNPU_E_NOMODEL);
    int32_t dn = h->models[slot].device;
    int64_t events = 0;
    for (int64_t i = 0; i < n && rc == VNPU_OK; i++) {
        arrive(h, dn, model, uid, uid, job_priority, cost_cycles, -1, -1, 0, h->clock_us);
        while (!idle_locked(h)) {
            int64_t t = next_event_all(h);
            if (t >= NEVER) {
                rc = VNPU_E_AGAIN;
                break;
            }
            advance_locked(h, t, 0);
        }
        while (h->ev_n > 0) events += drain_locked(h, scratch, scratch_cap);
    }
    *out_events = events;
    return leave_quiet(h, rc);
}
