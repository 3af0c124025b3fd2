/*
 * vLLM's EncoderCacheManager (mm_cache.h).  Each function names the Python
 * method it follows; the comments quote the rule where it is not obvious.
 */
#include "engine/mm_cache.h"

#include <string.h>

#include "common/alloc.h"

typedef struct ecm_entry {
    char *hash;
    int64_t embeds;      /* num_embeds_by_hash[hash] */
    kvp__strset_t refs;  /* cached[hash]: the referencing request ids */
    kvp__list_t fnode;   /* on m->freeable iff refs is empty */
} ecm_entry_t;

void kvp__ecm_init(kvp__ecm_t *m, int64_t capacity)
{
    memset(m, 0, sizeof *m);
    m->capacity = m->num_free = m->num_freeable = capacity;
    kvp__strmap_init(&m->entries);
    kvp__list_init(&m->freeable);
}

static void entry_free(ecm_entry_t *e)
{
    kvp__strset_cleanup(&e->refs);
    kvp__strfree(e->hash);
    kvp__free(e, sizeof *e);
}

void kvp__ecm_cleanup(kvp__ecm_t *m)
{
    for (size_t i = 0; i < m->entries.cap; i++)
        if (m->entries.slots[i].key)
            entry_free(m->entries.slots[i].val);
    kvp__strmap_cleanup(&m->entries);
    for (size_t i = 0; i < m->n_freed; i++)
        kvp__strfree(m->freed[i]);
    kvp__free(m->freed, m->cap_freed * sizeof *m->freed);
    memset(m, 0, sizeof *m);
}

static ecm_entry_t *entry_get(const kvp__ecm_t *m, const char *hash)
{
    return kvp__strmap_gets(&m->entries, hash);
}

bool kvp__ecm_has(const kvp__ecm_t *m, const char *mm_hash) { return entry_get(m, mm_hash) != NULL; }

int64_t kvp__ecm_cached_embeds(const kvp__ecm_t *m, const char *mm_hash)
{
    ecm_entry_t *e = entry_get(m, mm_hash);
    return e ? e->embeds : -1;
}

/* check_and_update_cache */
bool kvp__ecm_check_and_update(kvp__ecm_t *m, const kvp__ecm_req_t *r, size_t i)
{
    ecm_entry_t *e = entry_get(m, r->features[i].identifier);
    if (!e)
        return false;
    if (e->refs.n == 0) { /* leaves freeable */
        kvp__list_del(&e->fnode);
        m->num_freeable -= e->embeds;
    }
    if (kvp__strset_add(&e->refs, r->id, NULL) != KVP_OK) {
        /* out of memory: leave it unreferenced (freeable) and call it a miss */
        if (e->refs.n == 0) {
            kvp__list_add_tail(&m->freeable, &e->fnode);
            m->num_freeable += e->embeds;
        }
        return false;
    }
    r->cached[i] = 1;
    return true;
}

static void freed_push(kvp__ecm_t *m, char *hash)
{
    if (kvp__grow_in((void **)&m->freed, &m->cap_freed, m->n_freed + 1, sizeof *m->freed, 16) == 0)
        m->freed[m->n_freed++] = hash;
    else
        kvp__strfree(hash); /* the workers then keep it until the end: harmless */
}

/* can_allocate: "If there is not enough free space in num_free_slots but
 * there is enough reclaimable space in num_freeable_slots, entries will be
 * evicted from freeable ... until enough space is available".  Older
 * entries are evicted first. */
bool kvp__ecm_can_allocate(kvp__ecm_t *m, const kvp__ecm_req_t *r, size_t i, int64_t compute_budget,
                           int64_t num_to_schedule)
{
    int64_t need = r->features[i].num_embeds;
    if (need > compute_budget)
        return false;
    need += num_to_schedule;
    if (need <= m->num_free)
        return true;
    if (need > m->num_freeable)
        return false;
    while (need > m->num_free) {
        ecm_entry_t *e = KVP_LIST_FIRST_ENTRY(&m->freeable, ecm_entry_t, fnode);
        if (!e)
            return false; /* cannot happen while the invariants hold */
        kvp__list_del(&e->fnode);
        kvp__strmap_del(&m->entries, e->hash, strlen(e->hash));
        m->num_free += e->embeds;
        m->evictions++;
        char *h = e->hash;
        e->hash = NULL;
        entry_free(e);
        freed_push(m, h);
    }
    return true;
}

/* allocate */
kvp_status_t kvp__ecm_allocate(kvp__ecm_t *m, const kvp__ecm_req_t *r, size_t i)
{
    const kvp_ec_feature_t *f = &r->features[i];
    ecm_entry_t *e = entry_get(m, f->identifier);
    if (e && e->embeds != f->num_embeds)
        return KVP_ERR_INVALID_ARG; /* assert cached_num_encoder_embeds == num_encoder_embeds */
    if (m->num_free < f->num_embeds || m->num_freeable < f->num_embeds)
        return KVP_ERR_INVALID_ARG; /* the asserts on the free counts */
    bool fresh = !e;
    if (fresh) {
        e = kvp__calloc(1, sizeof *e);
        if (!e || !(e->hash = kvp__strdup(f->identifier))) {
            kvp__free(e, sizeof *e);
            return KVP_ERR_NO_MEMORY;
        }
        e->embeds = f->num_embeds;
        kvp__strmap_init(&e->refs);
        kvp__list_init(&e->fnode);
        if (kvp__strmap_put(&m->entries, e->hash, strlen(e->hash), e) != KVP_OK) {
            entry_free(e);
            return KVP_ERR_NO_MEMORY;
        }
    }
    bool was_freeable = e->refs.n == 0 && !fresh;
    if (kvp__strset_add(&e->refs, r->id, NULL) != KVP_OK) {
        if (fresh) {
            kvp__strmap_del(&m->entries, e->hash, strlen(e->hash));
            entry_free(e);
        }
        return KVP_ERR_NO_MEMORY;
    }
    if (was_freeable) {
        /* vLLM never allocates a cached hash (check_and_update_cache comes
         * first); kept consistent anyway. */
        kvp__list_del(&e->fnode);
        m->num_freeable -= e->embeds;
    }
    r->cached[i] = 1;
    /* vLLM charges the slots on every allocate (a second allocate of one
     * hash in one step is what the duplicate list prevents). */
    m->num_free -= f->num_embeds;
    m->num_freeable -= f->num_embeds;
    return KVP_OK;
}

/* free_encoder_input: "When the reference set for the corresponding mm_hash
 * becomes empty, the entry is appended to freeable"; it stays referenced
 * while another input of the same request with that hash is cached. */
void kvp__ecm_free_input(kvp__ecm_t *m, const kvp__ecm_req_t *r, size_t i)
{
    const char *hash = r->features[i].identifier;
    r->cached[i] = 0;
    ecm_entry_t *e = entry_get(m, hash);
    if (!e || e->refs.n == 0)
        return;
    for (size_t j = 0; j < r->n; j++)
        if (r->cached[j] && !strcmp(r->features[j].identifier, hash))
            return;
    kvp__strset_discard(&e->refs, r->id);
    if (e->refs.n == 0) {
        kvp__list_add_tail(&m->freeable, &e->fnode);
        m->num_freeable += e->embeds;
    }
}

void kvp__ecm_free(kvp__ecm_t *m, const kvp__ecm_req_t *r)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->cached[i])
            kvp__ecm_free_input(m, r, i);
}

/* get_freed_mm_hashes: "[h for h in self.freed if h not in self.cached]" */
kvp_status_t kvp__ecm_get_freed(kvp__ecm_t *m, kvp_ec_strlist_t *out)
{
    out->v = NULL;
    out->n = 0;
    size_t k = 0;
    for (size_t i = 0; i < m->n_freed; i++) {
        if (entry_get(m, m->freed[i])) {
            kvp__strfree(m->freed[i]);
            continue;
        }
        m->freed[k++] = m->freed[i];
    }
    if (k) {
        out->v = kvp__malloc(k * sizeof *out->v);
        if (!out->v) {
            for (size_t i = 0; i < k; i++)
                kvp__strfree(m->freed[i]);
            m->n_freed = 0;
            return KVP_ERR_NO_MEMORY;
        }
        memcpy(out->v, m->freed, k * sizeof *out->v);
        out->n = k;
    }
    m->n_freed = 0;
    return KVP_OK;
}

kvp_status_t kvp__ecm_check(const kvp__ecm_t *m)
{
    int64_t used = 0, freeable = 0;
    size_t nfree = 0;
    for (size_t i = 0; i < m->entries.cap; i++) {
        const ecm_entry_t *e = m->entries.slots[i].val;
        if (!m->entries.slots[i].key)
            continue;
        used += e->embeds;
        if (e->refs.n == 0) {
            freeable += e->embeds;
            if (!kvp__list_linked(&e->fnode))
                return KVP_ERR_INTERNAL;
        } else if (kvp__list_linked(&e->fnode)) {
            return KVP_ERR_INTERNAL;
        }
    }
    KVP_LIST_FOR_EACH(n, &m->freeable)
        nfree++;
    size_t unref = 0;
    for (size_t i = 0; i < m->entries.cap; i++)
        if (m->entries.slots[i].key && ((const ecm_entry_t *)m->entries.slots[i].val)->refs.n == 0)
            unref++;
    if (nfree != unref || m->num_free != m->capacity - used || m->num_freeable != m->num_free + freeable)
        return KVP_ERR_INTERNAL;
    return KVP_OK;
}
