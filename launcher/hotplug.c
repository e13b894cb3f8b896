/* hotplug.c: see hotplug.h. */
#include "hotplug.h"
#include "qsd/base/log.h"
#include "qsd/base/names.h"
#include "qsd/base/util.h"

#include <libvirt/virterror.h>
#include <sys/inotify.h>
#include <sys/un.h>

#define COMP "hotplug"
#define SCAN_MAX 256
#define POLL_PENDING_MS 100
#define POLL_DETACH_MS 250
#define POLL_STUCK_MS 2000

enum hp_state { HP_PENDING, HP_ATTACHED, HP_DETACHING, HP_STUCK, HP_FAILED };

struct hp_vol {
    char *base;           /* the volumes directory it is in */
    char *name;
    enum hp_state st;
    uint64_t since_ms;    /* first seen (pending) or detach requested */
    struct volume *vol;   /* attached / detaching / stuck */
    char target[DISK_TARGET_MAX];
    unsigned slot;        /* attached / detaching / stuck */
    bool at_start;
    char *socket_path;
    char *last_msg;       /* last reason it was not ready, to log once */
    int wd;               /* inotify watch inside the directory, or -1 */
    struct hp_vol *next;
};

struct hotplug {
    struct loop *loop;
    virDomainPtr dom;
    const struct vm_spec *spec;
    char **dirs;
    int *dir_wds;         /* inotify watch of each directory */
    size_t n_dirs;
    unsigned ready_timeout_ms, detach_timeout_ms;
    struct slot_ledger *ledger;
    char *report_path;
    bool cidata;
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
    free(v->last_msg);
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

/* Rewrite the report (layout.h) from the disks the domain has. */
static void write_report(struct hotplug *h)
{
    if (!h->report_path)
        return;
    size_t n = 0;
    for (struct hp_vol *v = h->vols; v; v = v->next)
        n++;
    _cleanup_free_ struct report_disk *d = xcalloc(n ? n : 1, sizeof(*d));
    n = 0;
    for (struct hp_vol *v = h->vols; v; v = v->next)
        if (v->st == HP_ATTACHED || v->st == HP_DETACHING || v->st == HP_STUCK)
            d[n++] = (struct report_disk){.volume = v->name, .id = v->vol->id, .dir = v->base,
                                          .slot = v->slot, .at_start = v->at_start};
    int r = layout_report_write(h->report_path, h->spec, d, n, h->cidata);
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
        if ((o->st == HP_ATTACHED || o->st == HP_DETACHING || o->st == HP_STUCK) && o->slot &&
            o->slot <= max)
            in_use[o->slot] = true;
    const struct vm_disk *listed = vm_spec_find_disk(h->spec, v->name);
    if (listed)
        return in_use[listed->slot] ? 0 : listed->slot;
    unsigned s = slot_ledger_pick(h->ledger, h->spec, v->name, in_use);
    if (s && slot_ledger_save(h->ledger) < 0)
        log_warn(COMP, "cannot save the slot ledger", "volume=%s", v->name);
    return s;
}

static const char *virt_err(void)
{
    const char *m = virGetLastErrorMessage();
    return m ? m : "unknown libvirt error";
}

/* Log a not-ready reason once per distinct reason (debug: it is expected
 * while a volume is being set up). */
static void note_reason(struct hp_vol *v, const char *msg)
{
    if (v->last_msg && streq(v->last_msg, msg))
        return;
    free(v->last_msg);
    v->last_msg = xstrdup(msg);
    _cleanup_free_ char *q = log_quote(msg);
    log_debug(COMP, "volume not ready", "volume=%s reason=%s", v->name, q);
}

static void try_attach(struct hotplug *h, struct hp_vol *v, const struct volume_entry *e)
{
    uint64_t now = now_ms();
    bool expired = now - v->since_ms > h->ready_timeout_ms;
    if (!e->vol) {
        note_reason(v, e->message ? e->message : strerror(-e->error));
        if (e->error != -ENOENT || expired) {
            _cleanup_free_ char *q = log_quote(v->last_msg);
            log_error(COMP, "volume refused", "volume=%s reason=%s dir=%s", v->name, q, v->base);
            v->st = HP_FAILED;
        }
        return;
    }
    _cleanup_free_ char *path = volume_socket_path(e->vol);
    if (strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
        log_error(COMP, "volume refused", "volume=%s reason=\"socket path too long\" dir=%s",
                  v->name, v->base);
        v->st = HP_FAILED;
        return;
    }
    int r = unix_socket_probe(path);
    if (r < 0) {
        _cleanup_free_ char *m = xasprintf("socket does not accept connections: %s", strerror(-r));
        note_reason(v, m);
        if (expired) {
            _cleanup_free_ char *q = log_quote(m);
            log_error(COMP, "volume refused", "volume=%s reason=%s dir=%s", v->name, q, v->base);
            v->st = HP_FAILED;
        }
        return;
    }
    unsigned slot = pick_slot(h, v);
    if (!slot) {
        log_error(COMP, "attach failed", "volume=%s error=\"no free disk slot (%u slots: %u listed, "
                  "hotplug_slots %u)\" dir=%s", v->name, vm_spec_disk_slots(h->spec),
                  h->spec->listed_slots, h->spec->hotplug_slots, v->base);
        v->st = HP_FAILED;
        return;
    }
    disk_target_name(slot - 1, v->target);
    _cleanup_free_ char *xml = NULL;
    r = domain_xml_disk(h->spec, e->vol, path, slot, 0, &xml);
    if (r < 0) {
        log_error(COMP, "attach failed", "volume=%s error=\"cannot build disk XML\"", v->name);
        v->st = HP_FAILED;
        return;
    }
    uint64_t t0 = now_ms();
    if (virDomainAttachDeviceFlags(h->dom, xml, VIR_DOMAIN_AFFECT_LIVE) < 0) {
        _cleanup_free_ char *q = log_quote(virt_err());
        log_error(COMP, "attach failed", "volume=%s error=%s", v->name, q);
        v->st = HP_FAILED;
        return;
    }
    v->vol = volume_dup(e->vol);
    v->socket_path = TAKE_PTR(path);
    v->st = HP_ATTACHED;
    v->slot = slot;
    struct pci_addr a;
    char guest[GUEST_ADDR_MAX];
    layout_disk_addr(h->spec, slot, &a, guest);
    log_info(COMP, "disk attached", "volume=%s serial=%s target=%s size=%llu read_only=%d "
             "queues=%u slot=%u guest_address=%s attach_ms=%llu since_seen_ms=%llu dir=%s",
             v->name, v->vol->id, v->target, (unsigned long long)v->vol->size, v->vol->read_only,
             v->vol->num_queues, slot, guest, (unsigned long long)(now_ms() - t0),
             (unsigned long long)(now_ms() - v->since_ms), v->base);
    write_report(h);
}

/* 1: the disk is gone from the live domain, 0: still there, <0: unknown. */
static int disk_gone(struct hotplug *h, struct hp_vol *v)
{
    char *xml = virDomainGetXMLDesc(h->dom, 0);
    if (!xml)
        return -EIO;
    bool has;
    int r = domain_xml_has_disk(xml, v->target, &has);
    free(xml);
    if (r < 0)
        return r;
    return !has;
}

/* virDomainDetachDeviceAlias is asynchronous: it asks the guest and returns
 * (virDomainDetachDeviceFlags would block up to 5 s inside libvirt waiting
 * for the guest).  Completion is seen in the live XML, re-checked on
 * libvirt's DEVICE_REMOVED event and on a timer, up to detach_timeout_ms. */
static void start_detach(struct hotplug *h, struct hp_vol *v)
{
    _cleanup_free_ char *alias = xasprintf("ua-%s", v->vol->id);
    v->since_ms = now_ms();
    v->st = HP_DETACHING;
    log_info(COMP, "detach requested", "volume=%s target=%s", v->name, v->target);
    if (virDomainDetachDeviceAlias(h->dom, alias, VIR_DOMAIN_AFFECT_LIVE) < 0) {
        _cleanup_free_ char *q = log_quote(virt_err());
        log_warn(COMP, "detach request failed", "volume=%s target=%s error=%s", v->name,
                 v->target, q);
    }
}

static void reconcile(struct hotplug *h);

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
    /* Known volumes first. */
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
            } else {
                try_attach(h, v, e);
            }
            break;
        case HP_DETACHING:
        case HP_STUCK: {
            int g = disk_gone(h, v);
            if (g == 1) {
                log_info(COMP, "disk detached", "volume=%s target=%s detach_ms=%llu%s", v->name,
                         v->target, (unsigned long long)(now - v->since_ms),
                         v->st == HP_STUCK ? " late=1" : "");
                hp_remove(h, v);
                write_report(h);
            } else if (v->st == HP_DETACHING && now - v->since_ms > h->detach_timeout_ms) {
                log_warn(COMP, "guest did not release disk", "volume=%s target=%s waited_ms=%llu",
                         v->name, v->target, (unsigned long long)(now - v->since_ms));
                v->st = HP_STUCK;
            }
            break;
        }
        case HP_FAILED:
            if (!e)
                hp_remove(h, v);
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
            (void)v;
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

    unsigned next_ms = 0;
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

int hotplug_new(struct loop *l, virDomainPtr dom, const struct vm_spec *spec,
                const struct hotplug_config *cfg, const struct domain_disk *initial,
                size_t n_initial, struct hotplug **ret)
{
    struct hotplug *h = xcalloc(1, sizeof(*h));
    h->loop = l;
    h->dom = dom;
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
