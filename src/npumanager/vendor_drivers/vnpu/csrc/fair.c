/* vnpu's fair scheduler: bands, one flow per (band, uid) with a virtual runtime and a
 * queue by (effective priority, id), a floor credit per band, and the choice of victims.
 * The rules are those of core/scheduler.py (the reference uses that module). */
#include <stdlib.h>

#include "vnpu_internal.h"

/* Running jobs (slots) by channel; m <= 64, so an insertion sort. */
void sort_by_channel(const vnpu_handle *h, int32_t *out, int32_t m) {
    for (int32_t i = 1; i < m; i++) {
        int32_t s = out[i], j = i;
        while (j > 0 && h->pool[out[j - 1]].channel > h->pool[s].channel) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = s;
    }
}

/* ---------------------------------------------------------------------------------------
 * Fair share (core/scheduler.py): bands, one flow per (band, uid) with a virtual runtime
 * and a queue by (effective priority, id), and a floor credit per band
 * ------------------------------------------------------------------------------------- */

static int32_t band_of(const device_t *d, int32_t eff) {
    int32_t b = 0;
    for (int32_t i = 0; i < d->spec.nbands; i++)
        if (eff >= d->spec.band_first[i]) b = i;
    return b;
}

static int64_t weight_of(const device_t *d, const work_t *w) {
    return VNPU_FAIR_WEIGHT_BASE + w->effective_priority - d->spec.band_first[w->band];
}

static int64_t flow_key(int32_t dn, int32_t band, int32_t uid) {
    return ((int64_t)uid * VNPU_MAX_DEVICES + dn) * VNPU_MAX_BANDS + band + 1;
}

/* a + dt * rate kept within [lo, hi] without overflow (a is within already, dt >= 0). */
static int64_t clamp_add(int64_t a, int64_t dt, int64_t rate, int64_t lo, int64_t hi) {
    if (rate == 0) return a;
    if (dt < ((int64_t)1 << 40)) { /* |rate| <= 100 * 64: the product fits */
        int64_t v = a + dt * rate;
        return v > hi ? hi : v < lo ? lo : v;
    }
    if (rate > 0) return dt > (hi - a) / rate ? hi : a + dt * rate;
    return dt > (a - lo) / -rate ? lo : a + dt * rate;
}

/* fold, past its fast path: d->fair and t differs from d->folded_us. A running job adds
 * at most 2100 a microsecond to its flow, so int64 holds two years of one uid keeping
 * all 64 channels busy (the Python reference has no such bound). */
void fold_since(vnpu_handle *h, device_t *d, int64_t t) {
    int64_t dt = t - d->folded_us;
    for (int32_t c = 0; c < d->nch; c++) {
        if (d->ch[c] == NO_SLOT) continue;
        work_t *w = &h->pool[d->ch[c]];
        h->flowpool[w->flow].vruntime += (t - w->acct_us) * weight_of(d, w);
        w->acct_us = t;
    }
    int64_t fl = d->spec.floor_percent, win = d->spec.floor_window_us, above = 0;
    for (int32_t b = 0; b < d->spec.nbands; b++) {
        if (d->live[b]) {
            int64_t rate = fl * above - (100 - fl) * d->busy[b];
            d->credit[b] = clamp_add(d->credit[b], dt, rate, -(100 - fl) * win, fl * win);
        }
        above += d->busy[b];
    }
    d->folded_us = t;
}

static void flow_link(vnpu_handle *h, int32_t *head, int32_t s) {
    flow_t *f = &h->flowpool[s];
    f->prev = NO_SLOT;
    f->next = *head;
    if (*head != NO_SLOT) h->flowpool[*head].prev = s;
    *head = s;
}

static void flow_unlink(vnpu_handle *h, int32_t *head, int32_t s) {
    flow_t *f = &h->flowpool[s];
    if (f->prev != NO_SLOT)
        h->flowpool[f->prev].next = f->next;
    else
        *head = f->next;
    if (f->next != NO_SLOT) h->flowpool[f->next].prev = f->prev;
}

static int32_t flow_new(vnpu_handle *h, device_t *d, int64_t key, int32_t band, int32_t uid,
                        int64_t vruntime) {
    int32_t s;
    if (h->flow_free != NO_SLOT) {
        s = h->flow_free;
        h->flow_free = h->flowpool[s].next_free;
    } else {
        s = h->flow_hw++;
    }
    flow_t *f = &h->flowpool[s];
    f->key = key;
    f->vruntime = vruntime;
    f->head = f->tail = NO_SLOT;
    f->running = 0;
    f->band = band;
    f->uid = uid;
    f->reused = 1;
    f->empty = 0;
    flow_link(h, &d->flows, s);
    map_put(&h->flow_map, key, s);
    return s;
}

static void flow_drop(vnpu_handle *h, int32_t *head, int32_t s) {
    flow_unlink(h, head, s);
    map_del(&h->flow_map, h->flowpool[s].key);
    h->flowpool[s].next_free = h->flow_free;
    h->flow_free = s;
}

static void drop_empty(vnpu_handle *h, device_t *d) {
    for (int32_t s = d->flows, next; s != NO_SLOT; s = next) {
        next = h->flowpool[s].next;
        if (h->flowpool[s].empty) flow_drop(h, &d->flows, s);
    }
    d->nempty = 0;
}

static int64_t band_min_vruntime(const vnpu_handle *h, const device_t *d, int32_t band) {
    int64_t m = 0;
    int any = 0;
    for (int32_t s = d->flows; s != NO_SLOT; s = h->flowpool[s].next) {
        const flow_t *f = &h->flowpool[s];
        if (f->band == band && !f->empty && (!any || f->vruntime < m)) {
            m = f->vruntime;
            any = 1;
        }
    }
    return m;
}

/* Into the flow's queue by (priority, id): arrivals append; a paused job is found early. */
static void fq_insert(vnpu_handle *h, flow_t *f, int32_t s) {
    work_t *w = &h->pool[s];
    if (f->tail == NO_SLOT || key_less(&h->pool[f->tail], w)) {
        w->qprev = f->tail;
        w->qnext = NO_SLOT;
        if (f->tail != NO_SLOT)
            h->pool[f->tail].qnext = s;
        else
            f->head = s;
        f->tail = s;
        return;
    }
    int32_t at = f->head;
    while (key_less(&h->pool[at], w)) at = h->pool[at].qnext;
    w->qnext = at;
    w->qprev = h->pool[at].qprev;
    if (w->qprev != NO_SLOT)
        h->pool[w->qprev].qnext = s;
    else
        f->head = s;
    h->pool[at].qprev = s;
}

static void fq_remove(vnpu_handle *h, flow_t *f, int32_t s) {
    work_t *w = &h->pool[s];
    if (w->qprev != NO_SLOT)
        h->pool[w->qprev].qnext = w->qnext;
    else
        f->head = w->qnext;
    if (w->qnext != NO_SLOT)
        h->pool[w->qnext].qprev = w->qprev;
    else
        f->tail = w->qprev;
}

void fair_enqueue(vnpu_handle *h, device_t *d, int32_t s, int64_t t) {
    fold(h, d, t);
    work_t *w = &h->pool[s];
    w->band = band_of(d, w->effective_priority);
    d->live[w->band]++;
    int64_t key = flow_key(w->device, w->band, w->uid);
    int32_t f = map_get(&h->flow_map, key);
    if (f == NO_SLOT) {
        f = flow_new(h, d, key, w->band, w->uid, band_min_vruntime(h, d, w->band));
    } else if (h->flowpool[f].empty) {
        h->flowpool[f].vruntime = band_min_vruntime(h, d, w->band);
        h->flowpool[f].empty = 0;
        d->nempty--;
    }
    w->flow = f;
    d->queued++;
    fq_insert(h, &h->flowpool[f], s);
}

/* A job of the flow is gone for good: the band may empty (credit reset), the flow too. */
static void fair_left(vnpu_handle *h, device_t *d, const work_t *w) {
    flow_t *f = &h->flowpool[w->flow];
    if (--d->live[w->band] == 0) d->credit[w->band] = 0;
    if (f->head != NO_SLOT || f->running != 0) return;
    /* The flow is gone (core/scheduler.py deletes it); its slot and table entry are kept
     * for the uid's next job, which starts it afresh, until the device has too many. */
    f->empty = 1;
    if (++d->nempty > VNPU_FLOW_CACHE) drop_empty(h, d);
}

void fair_remove(vnpu_handle *h, device_t *d, int32_t s, int64_t t) {
    fold(h, d, t);
    d->queued--;
    fq_remove(h, &h->flowpool[h->pool[s].flow], s);
    fair_left(h, d, &h->pool[s]);
}

void fair_start(vnpu_handle *h, device_t *d, int32_t s, int64_t t) {
    fold(h, d, t);
    work_t *w = &h->pool[s];
    w->acct_us = t;
    h->flowpool[w->flow].running++;
    d->busy[w->band]++;
}

void fair_stop(vnpu_handle *h, device_t *d, int32_t s, int64_t t, int requeue) {
    fold(h, d, t);
    work_t *w = &h->pool[s];
    h->flowpool[w->flow].running--;
    d->busy[w->band]--;
    if (!requeue) {
        fair_left(h, d, w);
        return;
    }
    d->queued++;
    fq_insert(h, &h->flowpool[w->flow], s);
}

/* Which flow's next job goes first: an owed band, a more important band, less virtual
 * runtime, then the better job. */
static int rank_less(const vnpu_handle *h, const device_t *d, const flow_t *a, const flow_t *b) {
    int oa = d->credit[a->band] > 0 ? 0 : 1, ob = d->credit[b->band] > 0 ? 0 : 1;
    if (oa != ob) return oa < ob;
    if (a->band != b->band) return a->band < b->band;
    if (a->vruntime != b->vruntime) return a->vruntime < b->vruntime;
    return key_less(&h->pool[a->sim], &h->pool[b->sim]);
}

/* The next n jobs a free channel would take, in order, without taking them. */
static int32_t fair_ranked(vnpu_handle *h, device_t *d, int32_t n, int32_t *out) {
    for (int32_t s = d->flows; s != NO_SLOT; s = h->flowpool[s].next)
        h->flowpool[s].sim = h->flowpool[s].head;
    int32_t k = 0;
    for (; k < n; k++) {
        int32_t best = NO_SLOT;
        for (int32_t s = d->flows; s != NO_SLOT; s = h->flowpool[s].next) {
            const flow_t *f = &h->flowpool[s];
            if (f->sim != NO_SLOT && (best == NO_SLOT || rank_less(h, d, f, &h->flowpool[best])))
                best = s;
        }
        if (best == NO_SLOT) break;
        flow_t *f = &h->flowpool[best];
        out[k] = f->sim;
        f->sim = h->pool[f->sim].qnext;
    }
    return k;
}

int32_t fair_pick(vnpu_handle *h, device_t *d, int64_t t) {
    if (d->queued == 0) return NO_SLOT;
    fold(h, d, t);
    int32_t best = NO_SLOT;
    for (int32_t f = d->flows; f != NO_SLOT; f = h->flowpool[f].next) {
        flow_t *fl = &h->flowpool[f];
        fl->sim = fl->head;
        if (fl->sim != NO_SLOT && (best == NO_SLOT || rank_less(h, d, fl, &h->flowpool[best])))
            best = f;
    }
    int32_t s = h->flowpool[best].head;
    fq_remove(h, &h->flowpool[best], s);
    d->queued--;
    return s;
}

static int fair_beats(const vnpu_handle *h, const device_t *d, const work_t *wt, const work_t *r) {
    if (wt->band != r->band) return wt->band < r->band || d->credit[wt->band] > 0;
    if (wt->uid == r->uid) return key_less(wt, r);
    return h->flowpool[wt->flow].vruntime < h->flowpool[r->flow].vruntime;
}

static int due_at(const device_t *d, const work_t *w, int64_t t) {
    int64_t e = t - w->run_start_us;
    return e > 0 && e % d->spec.slice_us == 0;
}

/* Worst-first order of running jobs: less important band, more virtual runtime, higher
 * effective priority, nearer slice boundary, lower channel. */
static int worse(const vnpu_handle *h, const device_t *d, const work_t *a, const work_t *b,
                 int64_t t) {
    if (a->band != b->band) return a->band > b->band;
    int64_t va = h->flowpool[a->flow].vruntime, vb = h->flowpool[b->flow].vruntime;
    if (va != vb) return va > vb;
    if (a->effective_priority != b->effective_priority)
        return a->effective_priority > b->effective_priority;
    int64_t ba = boundary_us(d, a, t), bb = boundary_us(d, b, t);
    if (ba != bb) return ba < bb;
    return a->channel < b->channel;
}

/* fair_victims, past its fast path: something is queued. */
int32_t fair_victims_queued(vnpu_handle *h, device_t *d, int64_t t, int32_t *out) {
    int32_t run[VNPU_MAX_CHANNELS], picks[VNPU_MAX_CHANNELS];
    int32_t nrun = 0, any_due = 0;
    for (int32_t c = 0; c < d->nch; c++) {
        if (d->ch[c] == NO_SLOT) continue;
        run[nrun++] = d->ch[c];
        if (due_at(d, &h->pool[d->ch[c]], t)) any_due = 1;
    }
    if (!any_due) return 0;
    fold(h, d, t); /* folding is associative: only what is compared below needs it */
    int32_t free = d->nch - nrun;
    int32_t np = fair_ranked(h, d, d->nch, picks);
    for (int32_t i = 1; i < nrun; i++) {
        int32_t s = run[i], j = i;
        while (j > 0 && worse(h, d, &h->pool[s], &h->pool[run[j - 1]], t)) {
            run[j] = run[j - 1];
            j--;
        }
        run[j] = s;
    }
    int32_t m = 0;
    for (int32_t i = 0; i < nrun && free + i < np; i++) {
        if (!fair_beats(h, d, &h->pool[picks[free + i]], &h->pool[run[i]])) break;
        if (due_at(d, &h->pool[run[i]], t)) out[m++] = run[i];
    }
    sort_by_channel(h, out, m);
    return m;
}

int64_t fair_next_pause_queued(const vnpu_handle *h, const device_t *d, int64_t now) {
    int64_t after = now > d->checked_us + 1 ? now : d->checked_us + 1, t = NEVER;
    for (int32_t c = 0; c < d->nch; c++)
        if (d->ch[c] != NO_SLOT) t = min64(t, boundary_us(d, &h->pool[d->ch[c]], after));
    return t;
}

/* Collect the ids of the device's queued work (fair) into ids from n; returns the new n. */
int32_t fair_queued_ids(const vnpu_handle *h, const device_t *d, int64_t model,
                               int64_t *ids, int32_t n) {
    for (int32_t f = d->flows; f != NO_SLOT; f = h->flowpool[f].next)
        for (int32_t s = h->flowpool[f].head; s != NO_SLOT; s = h->pool[s].qnext)
            if (model <= 0 || h->pool[s].model == model) ids[n++] = h->pool[s].id;
    return n;
}


/* Priorities changed: flows are rebuilt in id order; a flow of a (band, uid) that existed
 * keeps its virtual runtime, a new one takes the least its band had before (0 if none). */
void fair_rerank(vnpu_handle *h, device_t *d, int32_t dn, int64_t t) {
    fold(h, d, t);
    drop_empty(h, d);
    int64_t *ids = h->scratch, omin[VNPU_MAX_BANDS];
    int oany[VNPU_MAX_BANDS] = {0};
    int32_t n = 0;
    for (int32_t c = 0; c < d->nch; c++)
        if (d->ch[c] != NO_SLOT) ids[n++] = h->pool[d->ch[c]].id;
    n = fair_queued_ids(h, d, 0, ids, n);
    qsort(ids, (size_t)n, sizeof(int64_t), cmp_ids);
    int32_t old = d->flows;
    d->flows = NO_SLOT;
    for (int32_t s = old; s != NO_SLOT; s = h->flowpool[s].next) {
        flow_t *f = &h->flowpool[s];
        if (!oany[f->band] || f->vruntime < omin[f->band]) omin[f->band] = f->vruntime;
        oany[f->band] = 1;
        f->reused = 0;
        f->head = f->tail = NO_SLOT;
        f->running = 0;
    }
    for (int32_t b = 0; b < VNPU_MAX_BANDS; b++) d->live[b] = d->busy[b] = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t s = map_get(&h->work_map, ids[i]);
        work_t *w = &h->pool[s];
        w->effective_priority = effective(h, w->uid, w->original_uid, w->job_priority);
        w->band = band_of(d, w->effective_priority);
        int64_t key = flow_key(dn, w->band, w->uid);
        int32_t f = map_get(&h->flow_map, key);
        if (f != NO_SLOT && !h->flowpool[f].reused) {
            flow_unlink(h, &old, f);
            flow_link(h, &d->flows, f);
            h->flowpool[f].reused = 1;
        } else if (f == NO_SLOT) {
            f = flow_new(h, d, key, w->band, w->uid, oany[w->band] ? omin[w->band] : 0);
        }
        w->flow = f;
        d->live[w->band]++;
        if (w->state == RUNNING) {
            h->flowpool[f].running++;
            d->busy[w->band]++;
        } else {
            fq_insert(h, &h->flowpool[f], s);
        }
    }
    while (old != NO_SLOT) flow_drop(h, &old, old);
    for (int32_t b = 0; b < VNPU_MAX_BANDS; b++)
        if (!d->live[b]) d->credit[b] = 0;
}

