/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/confine.c: see confine.h.
 *
 * The seccomp filters are classic BPF written here (no libseccomp: it is not
 * one of the project's dependencies, and a fixed allow-list per profile is a
 * short linear program).  Shape of every filter:
 *   wrong architecture (or the x32 ABI)  -> kill the process
 *   a call in the DENY_KILL table        -> kill the process
 *   clone() with a namespace flag        -> kill the process
 *   a call in the profile's allow-list   -> allow
 *   anything else                        -> ENOSYS (clone3 too: glibc then
 *                                           falls back to clone, whose flags
 *                                           the filter can see)
 * userfaultfd is refused with EPERM rather than killed: libvhost-user probes
 * it on every connection and, refused, never offers postcopy. */
#include "qsd/base/confine.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/mount.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stddef.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define CONFINE_ARCH AUDIT_ARCH_X86_64
#define X32_BIT 0x40000000u
#elif defined(__aarch64__)
#define CONFINE_ARCH AUDIT_ARCH_AARCH64
#else
#error "confine.c: seccomp filters are written for x86_64 and aarch64 only"
#endif

#define CONFINE_MAX_PATHS 32

/* ------------------------------------------------------------ tables */

/* Killed in every profile: nothing we run has any business with these. */
static const int DENY_KILL[] = {
    SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev, SYS_mount, SYS_umount2,
    SYS_pivot_root, SYS_chroot, SYS_move_mount, SYS_open_tree, SYS_fsopen, SYS_fsconfig,
    SYS_fsmount, SYS_fspick, SYS_mount_setattr, SYS_bpf, SYS_keyctl, SYS_add_key,
    SYS_request_key, SYS_kexec_load, SYS_kexec_file_load, SYS_init_module, SYS_finit_module,
    SYS_delete_module, SYS_perf_event_open, SYS_unshare, SYS_setns, SYS_personality, SYS_acct,
    SYS_swapon, SYS_swapoff, SYS_reboot, SYS_quotactl, SYS_open_by_handle_at, SYS_kcmp,
    SYS_pidfd_getfd, SYS_process_madvise, SYS_settimeofday, SYS_clock_settime, SYS_clock_adjtime,
    SYS_adjtimex, SYS_sethostname, SYS_setdomainname, SYS_syslog, SYS_fanotify_init,
#ifdef SYS_iopl
    SYS_iopl, SYS_ioperm, SYS_modify_ldt, SYS_uselib, SYS_lookup_dcookie, SYS__sysctl,
#endif
#ifdef SYS_quotactl_fd
    SYS_quotactl_fd,
#endif
};

/* What every profile needs: memory, threads, signals, time, exit, exec of
 * the program itself (spawned children are filtered before execve). */
#define COMMON_CALLS                                                                            \
    SYS_read, SYS_write, SYS_readv, SYS_writev, SYS_close, SYS_close_range, SYS_fcntl, SYS_dup,    \
        SYS_dup3, SYS_lseek, SYS_fstat, SYS_newfstatat, SYS_statx, SYS_mmap, SYS_munmap,           \
        SYS_mremap, SYS_mprotect, SYS_madvise, SYS_brk, SYS_mincore, SYS_membarrier, SYS_futex,    \
        SYS_set_robust_list, SYS_get_robust_list, SYS_set_tid_address, SYS_rseq, SYS_rt_sigaction, \
        SYS_rt_sigprocmask, SYS_rt_sigreturn, SYS_rt_sigtimedwait, SYS_sigaltstack, SYS_tgkill,    \
        SYS_getpid, SYS_gettid, SYS_getppid, SYS_getuid, SYS_geteuid, SYS_getgid, SYS_getegid,     \
        SYS_getresuid, SYS_getresgid, SYS_getgroups, SYS_clock_gettime, SYS_clock_getres,          \
        SYS_gettimeofday, SYS_clock_nanosleep, SYS_nanosleep, SYS_sched_yield,                     \
        SYS_sched_getaffinity, SYS_prlimit64, SYS_getrusage, SYS_uname, SYS_sysinfo, SYS_getrandom, \
        SYS_restart_syscall, SYS_exit, SYS_exit_group, SYS_execve, SYS_execveat, SYS_prctl, SYS_ppoll,           \
        SYS_pselect6, SYS_epoll_create1, SYS_epoll_ctl, SYS_epoll_pwait, SYS_eventfd2,             \
        SYS_pipe2, SYS_clone, SYS_wait4, SYS_waitid, SYS_capget

#ifdef __x86_64__
#define COMMON_X86 SYS_arch_prctl, SYS_poll, SYS_select, SYS_epoll_wait, SYS_epoll_create, SYS_pipe, \
        SYS_dup2, SYS_time
#define FILE_X86 SYS_stat, SYS_lstat, SYS_access, SYS_readlink, SYS_open, SYS_unlink, SYS_rename
#else
#define COMMON_X86 SYS_read
#define FILE_X86 SYS_read
#endif

/* Files, images and block devices: QSD and qemu-img. */
#define FILE_CALLS                                                                              \
    SYS_openat, SYS_pread64, SYS_pwrite64, SYS_preadv, SYS_pwritev, SYS_preadv2, SYS_pwritev2,     \
        SYS_fsync, SYS_fdatasync, SYS_sync_file_range, SYS_fallocate, SYS_ftruncate,               \
        SYS_fadvise64, SYS_fstatfs, SYS_statfs, SYS_getdents64, SYS_readlinkat, SYS_faccessat,     \
        SYS_faccessat2, SYS_unlinkat, SYS_renameat, SYS_renameat2, SYS_ioctl, SYS_flock,           \
        SYS_copy_file_range, SYS_fgetxattr, SYS_getxattr, SYS_lgetxattr, SYS_getcwd, SYS_umask,     \
        SYS_io_uring_setup, SYS_io_uring_enter, SYS_io_uring_register, SYS_io_setup,              \
        SYS_io_destroy, SYS_io_submit, SYS_io_getevents, SYS_io_pgetevents, SYS_io_cancel,         \
        SYS_signalfd4, SYS_timerfd_create, SYS_timerfd_settime, SYS_timerfd_gettime,              \
        SYS_memfd_create, SYS_get_mempolicy, SYS_set_mempolicy, SYS_mbind, SYS_msync,             \
        SYS_sched_setaffinity, SYS_getpriority, SYS_setpriority, SYS_sched_getparam,              \
        SYS_sched_getscheduler, SYS_mlock, SYS_munlock

/* Sockets: QMP, the vhost-user export (fds passed both ways), librbd's
 * network connections. */
#define SOCKET_CALLS                                                                            \
    SYS_socket, SYS_socketpair, SYS_bind, SYS_listen, SYS_accept, SYS_accept4, SYS_connect,         \
        SYS_getsockname, SYS_getpeername, SYS_setsockopt, SYS_getsockopt, SYS_sendmsg,             \
        SYS_recvmsg, SYS_sendmmsg, SYS_recvmmsg, SYS_sendto, SYS_recvfrom, SYS_shutdown

static const int ALLOW_QSD[] = {COMMON_CALLS, COMMON_X86, FILE_CALLS, FILE_X86, SOCKET_CALLS};
static const int ALLOW_IMAGE[] = {COMMON_CALLS, COMMON_X86, FILE_CALLS, FILE_X86};
/* The filter removes the sockets it made at exit (unlinkat). */
static const int ALLOW_FILTER[] = {COMMON_CALLS, COMMON_X86, SOCKET_CALLS, SYS_pidfd_open,
                                   SYS_pidfd_send_signal, SYS_kill, SYS_signalfd4,
                                   SYS_timerfd_create, SYS_timerfd_settime, SYS_memfd_create,
                                   SYS_unlinkat};

/* The node endpoint's TLS gate (qsd-node-gate): it has read its keys and
 * bound its socket before confining itself, so it opens no file and
 * execs nothing: accept and connect (by name, from its working directory),
 * stream I/O, epoll, its signalfd, memory, and what glibc's abort needs
 * (sigaltstack: AddressSanitizer asks for it in a process under this
 * profile, unit/test_confine in a sanitizer build).
 * (clone without namespace flags passes in every profile, above.) */
static const int ALLOW_GATE[] = {
    SYS_read, SYS_write, SYS_readv, SYS_writev, SYS_close, SYS_fcntl, SYS_fstat,
    SYS_newfstatat, SYS_mmap, SYS_munmap, SYS_mremap, SYS_mprotect, SYS_madvise, SYS_brk,
    SYS_futex, SYS_rt_sigaction, SYS_rt_sigprocmask, SYS_rt_sigreturn, SYS_sigaltstack,
    SYS_tgkill, SYS_getpid, SYS_gettid, SYS_clock_gettime, SYS_getrandom, SYS_restart_syscall,
    SYS_exit, SYS_exit_group, SYS_epoll_ctl, SYS_epoll_pwait, SYS_socket, SYS_connect, SYS_accept4,
    SYS_shutdown, SYS_setsockopt, SYS_getsockopt, SYS_getsockname, SYS_getpeername,
    SYS_sendto, SYS_recvfrom, SYS_sendmsg, SYS_recvmsg,
#ifdef __x86_64__
    SYS_epoll_wait,
#endif
};

/* clone() flags that make a namespace: killed. */
#define CLONE_NS_FLAGS                                                                           \
    (CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET |     \
     CLONE_NEWCGROUP)

/* ------------------------------------------------------------ seccomp */

#define FILTER_MAX 1024

struct prog {
    struct sock_filter f[FILTER_MAX];
    unsigned n;
    bool overflow;
};

static void emit(struct prog *p, struct sock_filter ins)
{
    if (p->n >= FILTER_MAX) {
        p->overflow = true;
        return;
    }
    p->f[p->n++] = ins;
}

/* If nr == k: return ret (2 instructions, no far jumps). */
static void emit_match(struct prog *p, int nr, uint32_t ret)
{
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 1));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, ret));
}

static void build(struct prog *p, enum confine_profile profile)
{
    const int *allow;
    size_t n_allow;
    switch (profile) {
    case CONFINE_PROFILE_QSD:
        allow = ALLOW_QSD, n_allow = sizeof(ALLOW_QSD) / sizeof(int);
        break;
    case CONFINE_PROFILE_FILTER:
        allow = ALLOW_FILTER, n_allow = sizeof(ALLOW_FILTER) / sizeof(int);
        break;
    case CONFINE_PROFILE_GATE:
        allow = ALLOW_GATE, n_allow = sizeof(ALLOW_GATE) / sizeof(int);
        break;
    default:
        allow = ALLOW_IMAGE, n_allow = sizeof(ALLOW_IMAGE) / sizeof(int);
        break;
    }
    p->n = 0;
    p->overflow = false;
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, CONFINE_ARCH, 1, 0));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)));
#ifdef X32_BIT
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, X32_BIT, 0, 1));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
#endif
    for (size_t i = 0; i < sizeof(DENY_KILL) / sizeof(int); i++)
        emit_match(p, DENY_KILL[i], SECCOMP_RET_KILL_PROCESS);
    emit_match(p, SYS_userfaultfd, SECCOMP_RET_ERRNO | EPERM);
    emit_match(p, SYS_clone3, SECCOMP_RET_ERRNO | ENOSYS);
    /* clone: namespace flags (low word of args[0], little-endian) kill. */
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 4));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_NS_FLAGS, 0, 1));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    for (size_t i = 0; i < n_allow; i++)
        emit_match(p, allow[i], SECCOMP_RET_ALLOW);
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS));
}

int confine_seccomp(enum confine_profile profile)
{
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return -errno;
    if (profile == CONFINE_PROFILE_NONE)
        return 0;
    if (profile != CONFINE_PROFILE_QSD && profile != CONFINE_PROFILE_FILTER &&
        profile != CONFINE_PROFILE_IMAGE && profile != CONFINE_PROFILE_GATE)
        return -EINVAL;
    /* On the stack: this runs between fork and exec (no malloc). */
    struct prog p;
    build(&p, profile);
    if (p.overflow)
        return -E2BIG;
    struct sock_fprog fp = {.len = (unsigned short)p.n, .filter = p.f};
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &fp) != 0)
        return errno ? -errno : -EBUSY;
    return 0;
}

/* ------------------------------------------------------ mount namespace */

static size_t slen(const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    return n;
}

/* mkdir -p (mode 0755 whatever the umask) of a path inside our own tmpfs:
 * the mount point for a writable path under a hidden one. */
static int mkdirs(const char *path)
{
    char buf[4096];
    size_t n = slen(path);
    if (n == 0 || n >= sizeof(buf))
        return -ENAMETOOLONG;
    for (size_t i = 0; i <= n; i++) {
        buf[i] = path[i];
        if ((path[i] == '/' || path[i] == '\0') && i > 0) {
            buf[i] = '\0';
            if (mkdir(buf, 0755) == 0)
                chmod(buf, 0755);
            else if (errno != EEXIST)
                return -errno;
            buf[i] = path[i];
        }
    }
    return 0;
}

static int mount_rdonly(const char *path, bool on)
{
    struct mount_attr a = {0};
    if (on)
        a.attr_set = MOUNT_ATTR_RDONLY;
    else
        a.attr_clr = MOUNT_ATTR_RDONLY;
    return syscall(SYS_mount_setattr, AT_FDCWD, path, AT_RECURSIVE, &a, sizeof(a)) < 0 ? -errno : 0;
}

static int hide(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISDIR(st.st_mode))
        return mount("/dev/null", path, NULL, MS_BIND, NULL) < 0 ? -errno : 0;
    if (mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "size=64k,nr_inodes=256,mode=0755") < 0)
        return -errno;
    return 0;
}

/* Whether mount point mp (mountinfo's field, octal escapes decoded in
 * place) is path or beneath it. */
static bool at_or_beneath(char *mp, const char *path)
{
    size_t o = 0;
    for (size_t i = 0; mp[i]; i++) {
        if (mp[i] == '\\' && mp[i + 1] >= '0' && mp[i + 1] <= '3' && mp[i + 2] && mp[i + 3]) {
            mp[o++] = (char)((mp[i + 1] - '0') << 6 | (mp[i + 2] - '0') << 3 | (mp[i + 3] - '0'));
            i += 3;
        } else {
            mp[o++] = mp[i];
        }
    }
    mp[o] = '\0';
    size_t n = slen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    for (size_t i = 0; i < n; i++)
        if (mp[i] != path[i])
            return false;
    return mp[n] == '\0' || mp[n] == '/';
}

/* Every mount at or beneath path in this (new) namespace detached before
 * path is hidden: the copies unshare() made of what the host had mounted
 * there (another volume's filesystem at a kubelet staging path) would
 * otherwise stay here, out of reach of the host's unmount (measured,
 * kernel 6.18: a pod volume's unstage then found its loop device held by
 * a QSD started while its filesystem was mounted; docs/pod-volumes.md).
 * Mountinfo is read in pieces, no allocation (async-signal-safe); a pass
 * that detached something is followed by another (stacked mounts),
 * bounded. */
static void detach_beneath(const char *path)
{
    for (int pass = 0; pass < 16; pass++) {
        int fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return;
        char buf[4096], line[4096];
        size_t ll = 0;
        bool detached = false, skip = false;
        for (ssize_t got; (got = read(fd, buf, sizeof(buf))) > 0;)
            for (ssize_t i = 0; i < got; i++) {
                if (buf[i] != '\n') {
                    if (ll < sizeof(line) - 1)
                        line[ll++] = buf[i];
                    else
                        skip = true; /* too long for a path of ours */
                    continue;
                }
                line[ll] = '\0';
                /* id parent major:minor root mountpoint ... */
                char *f = line;
                for (int k = 0; k < 4 && f; k++) {
                    while (*f && *f != ' ')
                        f++;
                    f = *f ? f + 1 : NULL;
                }
                if (!skip && f) {
                    char *end = f;
                    while (*end && *end != ' ')
                        end++;
                    *end = '\0';
                    if (at_or_beneath(f, path) && umount2(f, MNT_DETACH) == 0)
                        detached = true;
                }
                ll = 0;
                skip = false;
            }
        close(fd);
        if (!detached)
            return;
    }
}

/* An empty file at path (0644), for a bind of a device node onto it. */
static int touch(const char *path, unsigned mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return -errno;
    close(fd);
    return 0;
}

/* confine.h dev_fd_file: a /dev of our own, n's file in fd/. */
static int dev_with_fd_file(unsigned n)
{
    static const char *const nodes[] = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random",
                                        "/dev/urandom"};
    enum { N_NODES = sizeof(nodes) / sizeof(nodes[0]) };
    int fds[N_NODES];
    int r = 0;
    size_t k = 0;
    for (; k < N_NODES; k++) {
        fds[k] = (int)syscall(SYS_open_tree, AT_FDCWD, nodes[k], OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (fds[k] < 0) {
            r = -errno;
            goto out;
        }
    }
    if (mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755") < 0) {
        r = -errno;
        goto out;
    }
    for (size_t i = 0; i < N_NODES; i++) {
        if ((r = touch(nodes[i], 0644)) < 0)
            goto out;
        if (syscall(SYS_move_mount, fds[i], "", AT_FDCWD, nodes[i], MOVE_MOUNT_F_EMPTY_PATH) < 0) {
            r = -errno;
            goto out;
        }
    }
    char path[32] = "/dev/fd/", digits[12];
    size_t nd = 0, len = slen(path);
    do
        digits[nd++] = (char)('0' + n % 10);
    while ((n /= 10) && nd < sizeof(digits));
    while (nd)
        path[len++] = digits[--nd];
    path[len] = '\0';
    if (mkdir("/dev/fd", 0755) < 0 || chmod("/dev/fd", 0755) < 0) { /* whatever the umask */
        r = -errno;
        goto out;
    }
    /* Descriptors 0-3 as usual (/proc/self/fd/K): an interpreted program
     * (a "#!" wrapper, proc.h program_fd3) is read by its interpreter
     * through /dev/fd/3. */
    static const char *const links[][2] = {{"/proc/self/fd/0", "/dev/fd/0"},
                                           {"/proc/self/fd/1", "/dev/fd/1"},
                                           {"/proc/self/fd/2", "/dev/fd/2"},
                                           {"/proc/self/fd/3", "/dev/fd/3"}};
    for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++)
        if (strcmp(links[i][1], path) != 0 && symlink(links[i][0], links[i][1]) < 0) {
            r = -errno;
            goto out;
        }
    r = touch(path, 0600);
out:
    for (size_t i = 0; i < k; i++)
        close(fds[i]);
    return r;
}

static int mount_ns(const struct confine *c)
{
    int fds[CONFINE_MAX_PATHS];
    size_t nw = 0;
    int r = 0;
    if (unshare(CLONE_NEWNS) < 0)
        return -errno;
    /* MS_SLAVE rather than MS_PRIVATE: nothing done here reaches the host,
     * and the host's unmounts still reach this namespace (a private copy
     * would keep every filesystem mounted at spawn time busy while the
     * QSD lives). */
    if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
        return -errno;
    /* Clones of the writable paths, taken before anything is hidden. */
    for (const char *const *w = c->writable; w && *w; w++) {
        if (nw == CONFINE_MAX_PATHS) {
            r = -E2BIG;
            goto out;
        }
        int fd = (int)syscall(SYS_open_tree, AT_FDCWD, *w,
                              OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
        if (fd < 0) {
            r = -errno;
            goto out;
        }
        fds[nw++] = fd;
    }
    if ((r = mount_rdonly("/", true)) < 0)
        goto out;
    /* Hide and bind back in path order, ancestors first (shorter paths
     * first): a writable path beneath a hidden one reappears on the tmpfs,
     * a hidden path beneath a writable one is hidden on the bind. */
    struct op {
        const char *path;
        int fd; /* the clone to attach, or -1: hide */
    } ops[2 * CONFINE_MAX_PATHS];
    size_t n_ops = 0;
    for (size_t i = 0; i < nw; i++)
        ops[n_ops++] = (struct op){c->writable[i], fds[i]};
    for (const char *const *h = c->hidden; h && *h; h++) {
        if (n_ops == 2 * CONFINE_MAX_PATHS) {
            r = -E2BIG;
            goto out;
        }
        ops[n_ops++] = (struct op){*h, -1};
    }
    for (size_t i = 1; i < n_ops; i++) /* insertion sort: stable, no allocation */
        for (size_t k = i; k > 0 && slen(ops[k - 1].path) > slen(ops[k].path); k--) {
            struct op t = ops[k];
            ops[k] = ops[k - 1];
            ops[k - 1] = t;
        }
    for (size_t i = 0; i < n_ops; i++) {
        if (ops[i].fd < 0) {
            detach_beneath(ops[i].path);
            if ((r = hide(ops[i].path)) < 0)
                goto out;
            continue;
        }
        if ((r = mkdirs(ops[i].path)) < 0)
            goto out;
        if (syscall(SYS_move_mount, ops[i].fd, "", AT_FDCWD, ops[i].path, MOVE_MOUNT_F_EMPTY_PATH) < 0) {
            r = -errno;
            goto out;
        }
    }
    if (c->dev_fd_file)
        r = dev_with_fd_file(c->dev_fd_file);
out:
    for (size_t i = 0; i < nw; i++)
        close(fds[i]);
    return r;
}

/* ----------------------------------------------------------- identity */

static int drop_caps(void)
{
    for (unsigned long cap = 0; cap <= 63; cap++) {
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
            if (errno == EINVAL)
                break; /* past the kernel's last capability */
            return -errno;
        }
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
        return -errno;
    return 0;
}

static int clear_caps(void)
{
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct d[2] = {{0}};
    return syscall(SYS_capset, &h, d) < 0 ? -errno : 0;
}

static int set_limit(int res, uint64_t v)
{
    if (!v)
        return 0;
    struct rlimit rl = {.rlim_cur = v, .rlim_max = v};
    return setrlimit(res, &rl) < 0 ? -errno : 0;
}

int confine_self(const struct confine *c)
{
    int r;
    if (c->mount_ns && (r = mount_ns(c)) < 0)
        return r;
    if ((r = set_limit(RLIMIT_AS, c->rlimit_as)) < 0 || (r = set_limit(RLIMIT_CPU, c->rlimit_cpu)) < 0 ||
        (r = set_limit(RLIMIT_NOFILE, c->rlimit_nofile)) < 0 ||
        (r = set_limit(RLIMIT_NPROC, c->rlimit_nproc)) < 0)
        return r;
    if ((r = drop_caps()) < 0)
        return r;
    /* Raw system calls: glibc's wrappers signal other threads (setxid), and
     * this may run in a forked child of a threaded process. */
    if (c->gid != (gid_t)-1) {
        if (syscall(SYS_setgroups, 0, NULL) < 0 || syscall(SYS_setresgid, c->gid, c->gid, c->gid) < 0)
            return -errno;
    }
    if (c->uid != (uid_t)-1 && syscall(SYS_setresuid, c->uid, c->uid, c->uid) < 0)
        return -errno;
    if ((r = clear_caps()) < 0)
        return r;
    return confine_seccomp(c->profile);
}
