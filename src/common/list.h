/*
 * An intrusive doubly-linked list (circular, with a head node), after the
 * Linux kernel's: the links live inside the listed struct, so putting an
 * object on a list or taking it off never allocates and never fails, and
 * removal is O(1) from the object alone.  An unlinked node points at itself
 * (kvp__list_init), so kvp__list_del is safe to call twice.
 *
 *   typedef struct conn { kvp__list_t link; ... } conn_t;
 *   kvp__list_t all;                 kvp__list_init(&all);
 *   kvp__list_add_tail(&all, &c->link);
 *   KVP_LIST_FOR_EACH_SAFE(n, tmp, &all) { conn_t *c = KVP_CONTAINER_OF(n, conn_t, link); ... }
 *   KVP_LIST_FOR_EACH_ENTRY(c, &all, conn_t, link) { ... }      (c: a conn_t *)
 *
 * Everything is inline: lists sit on hot paths (the store's LRU and free
 * lists), where a call per splice would show.
 *
 * Not thread-safe: the owner serialises (one event loop, or its lock).
 */
#ifndef KVP_COMMON_LIST_H
#define KVP_COMMON_LIST_H

#include <stddef.h>

typedef struct kvp__list {
    struct kvp__list *prev, *next;
} kvp__list_t;

#define KVP_CONTAINER_OF(ptr, type, member) ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

static inline void kvp__list_init(kvp__list_t *l) { l->prev = l->next = l; }
static inline int kvp__list_empty(const kvp__list_t *l) { return l->next == l; }
/* Is node n on some list? (initialised nodes only) */
static inline int kvp__list_linked(const kvp__list_t *n) { return n->next != n; }

static inline void kvp__list_insert(kvp__list_t *prev, kvp__list_t *n, kvp__list_t *next)
{
    n->prev = prev;
    n->next = next;
    prev->next = n;
    next->prev = n;
}
static inline void kvp__list_add_head(kvp__list_t *head, kvp__list_t *n) { kvp__list_insert(head, n, head->next); }
static inline void kvp__list_add_tail(kvp__list_t *head, kvp__list_t *n) { kvp__list_insert(head->prev, n, head); }

static inline void kvp__list_del(kvp__list_t *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    kvp__list_init(n);
}

/* The first node, or NULL when empty. */
static inline kvp__list_t *kvp__list_first(const kvp__list_t *head)
{
    return head->next == head ? NULL : head->next;
}

/* The entry holding node n, or NULL when n is NULL. */
#define KVP_LIST_ENTRY_OR_NULL(n, type, member) ((n) ? KVP_CONTAINER_OF((n), type, member) : (type *)NULL)
/* The first entry of a list, or NULL when it is empty. */
#define KVP_LIST_FIRST_ENTRY(head, type, member) KVP_LIST_ENTRY_OR_NULL(kvp__list_first(head), type, member)
/* The entry after e on the list at head, or NULL at the end. */
#define KVP_LIST_NEXT_ENTRY(e, head, type, member) \
    ((e)->member.next == (head) ? (type *)NULL : KVP_CONTAINER_OF((e)->member.next, type, member))

#define KVP_LIST_FOR_EACH(n, head) for (kvp__list_t *n = (head)->next; n != (head); n = n->next)
/* (n may be deleted in the body) */
#define KVP_LIST_FOR_EACH_SAFE(n, tmp, head)                                                  \
    for (kvp__list_t *n = (head)->next, *tmp = n->next; n != (head); n = tmp, tmp = n->next)

/* Over the entries, in order; e is a `type *` (e may not be deleted in the body). */
#define KVP_LIST_FOR_EACH_ENTRY(e, head, type, member)                                          \
    for (type *e = KVP_LIST_FIRST_ENTRY(head, type, member); e; e = KVP_LIST_NEXT_ENTRY(e, head, type, member))
/* The same, and e may be deleted (or moved to another list) in the body. */
#define KVP_LIST_FOR_EACH_ENTRY_SAFE(e, tmp, head, type, member)                                \
    for (type *e = KVP_LIST_FIRST_ENTRY(head, type, member), *tmp = e ? KVP_LIST_NEXT_ENTRY(e, head, type, member) : NULL; \
         e; e = tmp, tmp = e ? KVP_LIST_NEXT_ENTRY(e, head, type, member) : NULL)

#endif
