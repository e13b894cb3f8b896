/* SPDX-License-Identifier: Apache-2.0 */
/* hotplug.c: see hotplug.h. */
#include "hotplug.h"
#include "qsd/base/log.h"
#include "qsd/base/names.h"
#include "qsd/base/util.h"
#include "virt_thread.h"

#include <libvirt/virterror.h>
#include <sys/inotify.h>

#define COMP "hotplug"
#define SCAN_MAX 256
#define POLL_PENDING_MS 100
#define POLL_DETACH_MS 250
#define POLL_STUCK_MS 2000

/* pending -> attaching -> attached -> detaching -> gone (or stuck: the
 * guest did not release it in time), or failed (not retried until the
 * directory goes away).  An attach whose libvirt call passed its bound is
 * failed with timed_out set and its call still running (in_call): a late
 * success adopts the disk (attached), a late failure leaves it failed. */
enum hp_state { HP_PENDING, HP_ATTACHING, HP_ATTACHED, HP_DETACHING, HP_STUCK, HP_FAILED };

struct hotplug;

struct hp_vol {
    struct hotplug *h;
    char *base;           /* the volumes directory it is in */
    char *name;
    enum hp_state st;
    uint64_t since_ms;    /* first seen (pending) or detach requested */
    struct volume *vol;   /* from the attach request on, while the disk may exist */
    char target[DISK_TARGET_MAX];
    unsigned slot;        /* as vol: kept from other volumes while it may be used */
    bool at_start;
    bool in_call;         /* a libvirt call about it has not returned: keep the entry */
    bool timed_out;       /* failed because its attach call passed its bound */
    char *socket_path;
    char *reason;         /* why it is pending or failed (logged once per reason) */
    int wd;               /* inotify watch inside the directory, or -1 */
    struct hp_vol *next;
};

struct hotplug {
    struct loop *loop;
    struct virt_thread *vt;
    const struct vm_spec *spec;
    char **dirs;
    int *dir_wds;         /* inotify watch of each directory */
    size_t n_dirs;
    unsigned ready_timeout_ms, detach_timeout_ms, call_timeout_ms;
    struct slot_ledger *ledger;
    char *report_path;
    bool cidata;
    bool xml_in_call;     /* a live-XML request has not returned */
    bool detach_deferred; /* a detach waits for libvirt (a stuck call) */
    int ifd;
    struct loop_watch *watch;
    struct loop_timer *timer;
    struct hp_vol *vols;
};

static void hp_vol_free(struct hp_vol *v)
{
    if (!v)
        return;
    free(v->base);
    free(v->name);
    volume_free(v->vol);
    free(v->socket_path);
    free(v->reason);
    free(v);
}

static struct hp_vol *hp_find(struct hotplug *h, const char *base, const char *name)
{
    for (struct hp_vol *v = h->vols; v; v = v->next)
        if (streq(v->name, name) && streq(v->base, base))
            return v;
    return NULL;
}

static struct hp_vol *hp_add(struct hotplug *h, const char *base, const char *name,
                             enum hp_state st)
{
    struct hp_vol *v = xcalloc(1, sizeof(*v));
    v->h = h;
    v->base = xstrdup(base);
    v->name = xstrdup(name);
    v->st = st;
    v->wd = -1;
    v->since_ms = now_ms();
    v->next = h->vols;
    h->vols = v;
    return v;
}

static void hp_remove(struct hotplug *h, struct hp_vol *v)
{
    /* A directory moved elsewhere keeps its watch: drop it (a deleted one
     * has lost it already, which makes this fail harmlessly). */
    if (v->wd >= 0)
        inotify_rm_watch(h->ifd, v->wd);
    for (struct hp_vol **p = &h->vols; *p; p = &(*p)->next)
        if (*p == v) {
            *p = v->next;
            break;
        }
    hp_vol_free(v);
}

static bool has_disk_state(const struct hp_vol *v)
{
    return v->st == HP_ATTACHED || v->st == HP_DETACHING || v->st == HP_STUCK;
}

/* Rewrite the report (layout.h): the disks the domain has, and the volumes
 * that are not disks with their state and reason. */
static void write_report(struct hotplug *h)
{
    if (!h->report_path)
        return;
    size_t n = 0, nw = 0;
    for (struct hp_vol *v = h->vols; v; v = v->next)
        n++;
    _cleanup_free_ struct report_disk *d = xcalloc(n ? n : 1, sizeof(*d));
    _cleanup_free_ struct report_volume *w = xcalloc(n ? n : 1, sizeof(*w));
    n = 0;
    for (struct hp_vol *v = h->vols; v; v = v->next) {
        if (has_disk_state(v)) {
            d[n++] = (struct report_disk){.volume = v->name, .id = v->vol->id, .dir = v->base,
                                          .slot = v->slot, .at_start = v->at_start};
            continue;
        }
        const char *st = v->st == HP_PENDING     ? "pending"
                         : v->st == HP_ATTACHING ? "attaching"
                         : v->timed_out          ? "attach-timed-out"
                                                 : "failed";
        w[nw++] = (struct report_volume){.volume = v->name, .dir = v->base, .state = st,
                                         .reason = v->reason};
    }
    int r = layout_report_write(h->report_path, h->spec, d, n, w, nw, h->cidata);
    if (r < 0)
        log_warn(COMP, "cannot write the disk report", "file=%s error=\"%s\"", h->report_path,
                 strerror(-r));
}

/* The slot for v: a listed disk's own, else the ledger's pick; 0: none free. */
static unsigned pick_slot(struct hotplug *h, struct hp_vol *v)
{
    unsigned max = vm_spec_disk_slots(h->spec);
    _cleanup_free_ bool *in_use = xcalloc(max + 1, sizeof(*in_use));
    for (struct hp_vol *o = h->vols; o; o = o->next)
        if ((has_disk_state(o) || o->in_call) && o->slot && o->slot <= max)
            in_use[o->slot] = true;
    const struct vm_disk *listed = vm_spec_find_disk(h->spec, v->name);
    if (listed)
        return in_use[listed->slot] ? 0 : listed->slot;
    unsigned s = slot_ledger_pick(h->ledger, h->spec, v->name, in_use);
    if (s && slot_ledger_save(h->ledger) < 0)
        log_warn(COMP, "cannot save the slot ledger", "volume=%s", v->name);
    return s;
}

/* Set v's reason; true when it changed (so each distinct reason is logged
 * once). */
static bool set_reason(struct hp_vol *v, const char *msg)
{
    if (v->reason && streq(v->reason, msg))
        return false;
    free(v->reason);
    v->reason = xstrdup(msg);
    return true;
}

/* Not ready yet: expected while a volume is being set up (debug). */
static void note_reason(struct hp_vol *v, const char *msg)
{
    if (!set_reason(v, msg))
        return;
    _cleanup_free_ char *q = log_quote(msg);
    log_debug(COMP, "volume not ready", "volume=%s reason=%s", v->name, q);
}

static void refuse(struct hotplug *h, struct hp_vol *v, const char *reason)
{
    set_reason(v, reason);
    _cleanup_free_ char *q = log_quote(reason);
    log_error(COMP, "volume refused", "volume=%s reason=%s dir=%s", v->name, q, v->base);
    v->st = HP_FAILED;
    write_report(h);
}

/* v no longer holds a disk or a slot. */
static void release(struct hp_vol *v)
{
    volume_free(v->vol);
    v->vol = NULL;
    free(v->socket_path);
    v->socket_path = NULL;
    v->slot = 0;
    v->target[0] = 0;
}

/* "libvirt busy: ..." when a libvirt call is stuck (virt_thread.h), else NULL. */
static char *libvirt_busy(struct hotplug *h)
{
    const char *what = virt_thread_stuck(h->vt, NULL);
    return what ? xasprintf("libvirt busy: \"%s\" has not returned (past its %u ms bound)", what,
                            h->call_timeout_ms)
                : NULL;
}

static int call_attach(virDomainPtr dom, const char *xml, char **ret_text)
{
    return virDomainAttachDeviceFlags(dom, xml, VIR_DOMAIN_AFFECT_LIVE);
}

static int call_detach(virDomainPtr dom, const char *alias, char **ret_text)
{
    return virDomainDetachDeviceAlias(dom, alias, VIR_DOMAIN_AFFECT_LIVE);
}

static int call_xml(virDomainPtr dom, const char *unused, char **ret_text)
{
    *ret_text = virDomainGetXMLDesc(dom, 0);
    return *ret_text ? 0 : -1;
}

static void reconcile(struct hotplug *h);

static void log_attached(struct hotplug *h, struct hp_vol *v, uint64_t call_ms, bool late)
{
    struct pci_addr a;
    char guest[GUEST_ADDR_MAX];
    layout_disk_addr(h->spec, v->slot, &a, guest);
    log_info(COMP, "disk attached", "volume=%s serial=%s target=%s size=%llu read_only=%d "
             "queues=%u slot=%u guest_address=%s attach_ms=%llu since_seen_ms=%llu%s dir=%s",
             v->name, v->vol->id, v->target, (unsigned long long)v->vol->size, v->vol->read_only,
             v->vol->num_queues, v->slot, guest, (unsigned long long)call_ms,
             (unsigned long long)(now_ms() - v->since_ms), late ? " late=1" : "", v->base);
}

static void on_attach_done(const struct virt_reply *r, void *opaque)
{
    struct hp_vol *v = opaque;
    struct hotplug *h = v->h;
    v->in_call = r->status == -ETIMEDOUT && r->started;
    if (r->status == 0) {
        v->st = HP_ATTACHED;
        v->timed_out = false;
        free(v->reason);
        v->reason = NULL;
        log_attached(h, v, r->ms, r->late);
    } else if (r->status == -ETIMEDOUT && r->started) {
        _cleanup_free_ char *m = xasprintf(
            "attach did not return within %u ms; the call goes on inside libvirt: the disk is "
            "adopted if it succeeds later", h->call_timeout_ms);
        set_reason(v, m);
        v->st = HP_FAILED;
        v->timed_out = true;
        log_error(COMP, "attach timed out", "volume=%s bound_ms=%u slot=%u note=\"the call goes on "
                  "inside libvirt; no other libvirt call is made until it returns\" dir=%s",
                  v->name, h->call_timeout_ms, v->slot, v->base);
    } else if (r->status == -ETIMEDOUT) {
        /* Queued behind a call that did not return: never ran. */
        release(v);
        v->st = HP_PENDING;
        _cleanup_free_ char *m = xasprintf("libvirt busy: attach not started within %u ms",
                                           h->call_timeout_ms);
        set_reason(v, m);
        log_warn(COMP, "attach deferred", "volume=%s reason=\"%s\" dir=%s", v->name, m, v->base);
    } else {
        _cleanup_free_ char *q = log_quote(r->error);
        log_error(COMP, "attach failed", "volume=%s error=%s%s dir=%s", v->name, q,
                  r->late ? " late=1" : "", v->base);
        set_reason(v, r->error);
        release(v);
        v->st = HP_FAILED;
        v->timed_out = false;
    }
    write_report(h);
    if (!v->in_call)
        reconcile(h); /* e.g. its directory went away meanwhile: detach */
}

static void try_attach(struct hotplug *h, struct hp_vol *v, const struct volume_entry *e)
{
    uint64_t now = now_ms();
    bool expired = now - v->since_ms > h->ready_timeout_ms;
    if (!e->vol) {
        note_reason(v, e->message ? e->message : strerror(-e->error));
        if (e->error != -ENOENT || expired)
            refuse(h, v, v->reason);
        return;
    }
    _cleanup_free_ char *why = NULL;
    int r = volume_socket_probe(e->vol, &why);
    if (r < 0) {
        note_reason(v, why);
        if (expired || r == -ENAMETOOLONG)
            refuse(h, v, why);
        return;
    }
    _cleanup_free_ char *path = volume_socket_path(e->vol);
    _cleanup_free_ char *busy = libvirt_busy(h);
    if (busy) {
        if (set_reason(v, busy)) {
            _cleanup_free_ char *q = log_quote(busy);
            log_warn(COMP, "attach deferred", "volume=%s reason=%s dir=%s", v->name, q, v->base);
            write_report(h);
        }
        if (expired)
            refuse(h, v, busy);
        return;
    }
    unsigned slot = pick_slot(h, v);
    if (!slot) {
        log_error(COMP, "attach failed", "volume=%s error=\"no free disk slot (%u slots: %u listed, "
                  "hotplug_slots %u)\" dir=%s", v->name, vm_spec_disk_slots(h->spec),
                  h->spec->listed_slots, h->spec->hotplug_slots, v->base);
        set_reason(v, "no free disk slot");
        v->st = HP_FAILED;
        write_report(h);
        return;
    }
    _cleanup_free_ char *xml = NULL;
    r = domain_xml_disk(h->spec, e->vol, path, slot, 0, &xml);
    if (r < 0) {
        log_error(COMP, "attach failed", "volume=%s error=\"cannot build disk XML\"", v->name);
        set_reason(v, "cannot build disk XML");
        v->st = HP_FAILED;
        write_report(h);
        return;
    }
    _cleanup_free_ char *what = xasprintf("attach volume=%s", v->name);
    r = virt_call(h->vt, what, call_attach, xml, h->call_timeout_ms, on_attach_done, v);
    if (r < 0) {
        note_reason(v, "libvirt queue full");
        return;
    }
    v->st = HP_ATTACHING;
    v->in_call = true;
    v->vol = volume_dup(e->vol);
    v->socket_path = TAKE_PTR(path);
    v->slot = slot;
    disk_target_name(slot - 1, v->target);
    write_report(h);
}

static void on_detach_done(const struct virt_reply *r, void *opaque)
{
    struct hp_vol *v = opaque;
    struct hotplug *h = v->h;
    if (r->status == -ETIMEDOUT && r->started) {
        log_warn(COMP, "detach request timed out", "volume=%s target=%s bound_ms=%u", v->name,
                 v->target, h->call_timeout_ms);
        return; /* in_call stays: the late reply follows */
    }
    v->in_call = false;
    if (r->status == -ETIMEDOUT) {
        /* Never ran (queued behind a stuck call): asked again later. */
        log_warn(COMP, "detach deferred", "volume=%s target=%s reason=\"libvirt busy\"", v->name,
                 v->target);
        v->st = HP_ATTACHED;
        h->detach_deferred = true;
    } else if (r->status < 0) {
        _cleanup_free_ char *q = log_quote(r->error);
        log_warn(COMP, "detach request failed", "volume=%s target=%s error=%s%s", v->name,
                 v->target, q, r->late ? " late=1" : "");
    }
    reconcile(h);
}

/* virDomainDetachDeviceAlias is asynchronous: it asks the guest and returns
 * (virDomainDetachDeviceFlags would block up to 5 s inside libvirt waiting
 * for the guest).  Completion is seen in the live XML, re-checked on
 * libvirt's DEVICE_REMOVED event and on a timer, up to detach_timeout_ms.
 * While a libvirt call is stuck the request waits (the disk stays attached). */
static void start_detach(struct hotplug *h, struct hp_vol *v)
{
    _cleanup_free_ char *busy = libvirt_busy(h);
    if (busy) {
        if (set_reason(v, busy)) {
            _cleanup_free_ char *q = log_quote(busy);
            log_warn(COMP, "detach deferred", "volume=%s target=%s reason=%s", v->name, v->target,
                     q);
        }
        h->detach_deferred = true;
        return;
    }
    _cleanup_free_ char *alias = domain_disk_alias(v->vol->id);
    _cleanup_free_ char *what = xasprintf("detach volume=%s", v->name);
    if (virt_call(h->vt, what, call_detach, alias, h->call_timeout_ms, on_detach_done, v) < 0) {
        h->detach_deferred = true;
        return;
    }
    free(v->reason);
    v->reason = NULL;
    v->in_call = true;
    v->since_ms = now_ms();
    v->st = HP_DETACHING;
    log_info(COMP, "detach requested", "volume=%s target=%s alias=%s", v->name, v->target, alias);
}

/* The live XML: every detaching disk that is gone from it is removed. */
static void on_xml_done(const struct virt_reply *r, void *opaque)
{
    struct hotplug *h = opaque;
    if (r->status == -ETIMEDOUT && r->started)
        return; /* xml_in_call stays: the late reply follows */
    h->xml_in_call = false;
    if (r->status < 0 || !r->text)
        return; /* asked again on the next poll */
    uint64_t now = now_ms();
    bool changed = false;
    for (struct hp_vol *v = h->vols, *next; v; v = next) {
        next = v->next;
        if ((v->st != HP_DETACHING && v->st != HP_STUCK) || v->in_call)
            continue;
        bool has;
        if (domain_xml_has_disk(r->text, v->target, &has) < 0 || has)
            continue;
        log_info(COMP, "disk detached", "volume=%s target=%s detach_ms=%llu%s", v->name,
                 v->target, (unsigned long long)(now - v->since_ms),
                 v->st == HP_STUCK ? " late=1" : "");
        hp_remove(h, v);
        changed = true;
    }
    if (changed)
        write_report(h);
}

static void on_timer(struct loop *l, void *opaque)
{
    struct hotplug *h = opaque;
    h->timer = NULL;
    reconcile(h);
}

static void reconcile(struct hotplug *h)
{
    struct volume_scan scan = {0};
    const char *failed = NULL;
    int r = volumes_scan((const char *const *)h->dirs, h->n_dirs, SCAN_MAX, &scan, &failed);
    if (r < 0) {
        log_error(COMP, "scan failed", "dir=%s error=\"%s\"", failed ? failed : "-",
                  strerror(-r));
        /* Try again later rather than detaching everything. */
        if (!h->timer)
            h->timer = loop_timer_add(h->loop, POLL_STUCK_MS, on_timer, h);
        return;
    }
    uint64_t now = now_ms();
    bool check_xml = false;
    h->detach_deferred = false;
    /* Known volumes first.  One with a libvirt call out is kept until the
     * call returns (its reply handler runs reconcile again). */
    for (struct hp_vol *v = h->vols, *next; v; v = next) {
        next = v->next;
        const struct volume_entry *e = volume_scan_find_in(&scan, v->base, v->name);
        switch (v->st) {
        case HP_ATTACHED:
            if (!e)
                start_detach(h, v);
            break;
        case HP_PENDING:
            if (!e) {
                log_info(COMP, "volume went away before attach", "volume=%s", v->name);
                hp_remove(h, v);
                write_report(h);
            } else {
                try_attach(h, v, e);
            }
            break;
        case HP_ATTACHING:
            break;
        case HP_DETACHING:
        case HP_STUCK:
            if (v->st == HP_DETACHING && now - v->since_ms > h->detach_timeout_ms) {
                log_warn(COMP, "guest did not release disk", "volume=%s target=%s waited_ms=%llu",
                         v->name, v->target, (unsigned long long)(now - v->since_ms));
                v->st = HP_STUCK;
            }
            check_xml = true;
            break;
        case HP_FAILED:
            if (!e && !v->in_call) {
                hp_remove(h, v);
                write_report(h);
            }
            break;
        }
    }
    /* New directory entries. */
    for (size_t i = 0; i < scan.n; i++) {
        const struct volume_entry *e = &scan.entries[i];
        if (hp_find(h, e->base, e->name))
            continue;
        const char *reason;
        if (name_validate(e->name, &reason) < 0) {
            _cleanup_free_ char *q = log_quote(e->name);
            struct hp_vol *v = hp_add(h, e->base, e->name, HP_FAILED);
            set_reason(v, reason);
            log_error(COMP, "volume refused", "volume=%s reason=\"%s\" dir=%s", q, reason,
                      e->base);
            continue;
        }
        struct hp_vol *v = hp_add(h, e->base, e->name, HP_PENDING);
        log_info(COMP, "volume appeared", "volume=%s dir=%s", v->name, v->base);
        /* Watch inside too: catches the socket or volume.json arriving
         * (a bind mount over the directory does not; the timer does). */
        _cleanup_free_ char *sub = xasprintf("%s/%s", e->base, e->name);
        v->wd = inotify_add_watch(h->ifd, sub, IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE |
                                                   IN_ONLYDIR | IN_DONT_FOLLOW);
        try_attach(h, v, e);
    }
    volume_scan_clear(&scan);
    if (check_xml && !h->xml_in_call && !virt_thread_stuck(h->vt, NULL) &&
        virt_call(h->vt, "get live XML", call_xml, NULL, h->call_timeout_ms, on_xml_done, h) == 0)
        h->xml_in_call = true;

    unsigned next_ms = h->detach_deferred ? POLL_DETACH_MS : 0;
    for (struct hp_vol *v = h->vols; v; v = v->next) {
        unsigned ms = v->st == HP_PENDING     ? POLL_PENDING_MS
                      : v->st == HP_DETACHING ? POLL_DETACH_MS
                      : v->st == HP_STUCK     ? POLL_STUCK_MS
                                              : 0;
        if (ms && (!next_ms || ms < next_ms))
            next_ms = ms;
    }
    if (h->timer) {
        loop_timer_cancel(h->timer);
        h->timer = NULL;
    }
    if (next_ms)
        h->timer = loop_timer_add(h->loop, next_ms, on_timer, h);
}

static void on_inotify(struct loop *l, int fd, uint32_t revents, void *opaque)
{
    struct hotplug *h = opaque;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    bool any = false;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0)
            break;
        any = true;
        for (char *p = buf; p < buf + n;) {
            struct inotify_event *ev = (struct inotify_event *)p;
            const char *dir = "-";
            for (size_t i = 0; i < h->n_dirs; i++)
                if (h->dir_wds[i] == ev->wd)
                    dir = h->dirs[i];
            if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT))
                log_error(COMP, "volumes directory went away", "dir=%s", dir);
            if (ev->mask & IN_Q_OVERFLOW)
                log_warn(COMP, "inotify overflow", "dir=%s", dir);
            p += sizeof(*ev) + ev->len;
        }
    }
    if (any)
        reconcile(h);
}

int hotplug_new(struct loop *l, struct virt_thread *vt, const struct vm_spec *spec,
                const struct hotplug_config *cfg, const struct domain_disk *initial,
                size_t n_initial, struct hotplug **ret)
{
    struct hotplug *h = xcalloc(1, sizeof(*h));
    h->loop = l;
    h->vt = vt;
    h->spec = spec;
    h->n_dirs = cfg->n_volumes_dirs;
    h->dirs = xcalloc(h->n_dirs ? h->n_dirs : 1, sizeof(*h->dirs));
    h->dir_wds = xcalloc(h->n_dirs ? h->n_dirs : 1, sizeof(*h->dir_wds));
    for (size_t i = 0; i < h->n_dirs; i++) {
        h->dirs[i] = xstrdup(cfg->volumes_dirs[i]);
        h->dir_wds[i] = -1;
    }
    h->ready_timeout_ms = cfg->ready_timeout_ms;
    h->detach_timeout_ms = cfg->detach_timeout_ms;
    h->call_timeout_ms = cfg->call_timeout_ms;
    h->ledger = cfg->ledger;
    h->report_path = cfg->report_path ? xstrdup(cfg->report_path) : NULL;
    h->cidata = cfg->cidata;
    h->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (h->ifd < 0) {
        int e = errno;
        hotplug_free(h);
        return -e;
    }
    for (size_t i = 0; i < h->n_dirs; i++) {
        h->dir_wds[i] = inotify_add_watch(h->ifd, h->dirs[i],
                                          IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO |
                                              IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR);
        if (h->dir_wds[i] < 0) {
            int e = errno;
            hotplug_free(h);
            return -e;
        }
    }
    for (size_t i = 0; i < n_initial; i++) {
        struct hp_vol *v = hp_add(h, initial[i].vol->base, initial[i].vol->dir, HP_ATTACHED);
        v->vol = volume_dup(initial[i].vol);
        v->socket_path = volume_socket_path(v->vol);
        snprintf(v->target, sizeof(v->target), "%s", initial[i].target);
        v->slot = initial[i].slot;
        v->at_start = true;
    }
    write_report(h);
    h->watch = loop_watch_fd(l, h->ifd, POLLIN, on_inotify, h);
    /* Anything that changed between the scan at start and the watch. */
    reconcile(h);
    *ret = h;
    return 0;
}

void hotplug_kick(struct hotplug *h)
{
    if (h)
        reconcile(h);
}

void hotplug_free(struct hotplug *h)
{
    if (!h)
        return;
    loop_watch_remove(h->watch);
    loop_timer_cancel(h->timer);
    while (h->vols)
        hp_remove(h, h->vols);
    if (h->ifd >= 0)
        close(h->ifd);
    for (size_t i = 0; i < h->n_dirs; i++)
        free(h->dirs[i]);
    free(h->dirs);
    free(h->dir_wds);
    free(h->report_path);
    free(h);
}
