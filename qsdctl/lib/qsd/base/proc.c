/* SPDX-License-Identifier: Apache-2.0 */
/* qsd/base/proc.c: see proc.h. */
#include "qsd/base/proc.h"
#include "qsd/base/confine.h"
#include "qsd/base/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define PROC_MAX_OUTPUT (1u << 20)

void proc_result_clear(struct proc_result *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

int pidfd_open_pid(pid_t pid)
{
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    return fd < 0 ? -errno : fd;
}

int pidfd_signal(int pidfd, int sig)
{
    return syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0) < 0 ? -errno : 0;
}

struct capture {
    int fd;
    char *buf;
    size_t len;
};

static void capture_read(struct capture *c)
{
    char tmp[8192];
    ssize_t n = read(c->fd, tmp, sizeof(tmp));
    if (n <= 0) {
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            close(c->fd);
            c->fd = -1;
        }
        return;
    }
    size_t keep = MIN((size_t)n, PROC_MAX_OUTPUT - c->len);
    if (keep) {
        c->buf = xrealloc(c->buf, c->len + keep + 1);
        memcpy(c->buf + c->len, tmp, keep);
        c->len += keep;
        c->buf[c->len] = '\0';
    }
}

/* The program execvp would run (PATH searched), or NULL.  *ret_script: it
 * starts with "#!" (its interpreter then opens it by /dev/fd/N, so the
 * descriptor must survive exec). */
static char *find_program(const char *name, bool *ret_script)
{
    char *path = NULL;
    if (strchr(name, '/')) {
        path = xstrdup(name);
    } else {
        const char *env = getenv("PATH");
        _cleanup_free_ char *dirs = xstrdup(env ? env : "/usr/local/bin:/usr/bin:/bin");
        char *save = NULL;
        for (char *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
            char *cand = xasprintf("%s/%s", d[0] ? d : ".", name);
            if (access(cand, X_OK) == 0) {
                path = cand;
                break;
            }
            free(cand);
        }
    }
    char head[2] = {0};
    _cleanup_close_ int fd = path ? open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK) : -1;
    *ret_script = fd >= 0 && read(fd, head, 2) == 2 && head[0] == '#' && head[1] == '!';
    return path;
}

int proc_spawn(const struct proc_spawn *s, pid_t *ret_pid, int *ret_pidfd, int *ret_exec_fd)
{
    int execp[2] = {-1, -1};
    /* A confined child may not see its program's directory (a private
     * mount namespace, another uid): it opens the program first and execs
     * that descriptor. */
    bool script = false;
    _cleanup_free_ char *program = s->argv && s->confine ? find_program(s->argv[0], &script) : NULL;
    bool script3 = false;
    _cleanup_free_ char *program3 = s->program_fd3 ? find_program(s->program_fd3, &script3) : NULL;
    if (s->program_fd3 && !program3)
        return -ENOENT;
    if (s->argv && pipe2(execp, O_CLOEXEC) < 0)
        return -errno;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = -errno;
        if (execp[0] >= 0)
            close(execp[0]), close(execp[1]);
        return e;
    }
    if (pid == 0) {
        /* The child: async-signal-safe calls only until exec or fn. */
        if (s->die_with_parent) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(127);
        }
        for (size_t i = 0; i < s->n_join; i++) {
            if (write(s->join_fds[i], "0\n", 2) < 0) {
                int e = errno;
                (void)!write(execp[1], &e, sizeof(e));
                _exit(126);
            }
        }
        if (s->new_session)
            setsid();
        if (s->umask >= 0)
            umask((mode_t)s->umask);
        /* Out of the way of the descriptors placed below (0-3). */
        int keep = s->keep_fd >= 0 ? fcntl(s->keep_fd, F_DUPFD_CLOEXEC, 16) : -1;
        if (s->keep_fd >= 0 && keep < 0) {
            int e = errno;
            (void)!write(execp[1], &e, sizeof(e));
            _exit(127);
        }
        int devnull = open("/dev/null", O_RDWR);
        int fds[3] = {s->stdin_fd, s->stdout_fd, s->stderr_fd};
        for (int i = 0; i < 3; i++)
            dup2(fds[i] >= 0 ? fds[i] : devnull, i);
        struct sigaction dfl = {.sa_handler = SIG_DFL};
        for (int sig = 1; sig < NSIG; sig++)
            sigaction(sig, &dfl, NULL); /* EINVAL for SIGKILL, SIGSTOP, internal ones */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (program3) {
            int fd3 = open(program3, O_PATH);
            if (fd3 < 0 || (fd3 != 3 && (dup2(fd3, 3) < 0 || close(fd3) < 0))) {
                int e = errno;
                (void)!write(execp[1], &e, sizeof(e));
                _exit(127);
            }
        }
        if (keep >= 0 && dup2(keep, s->keep_fd_at) < 0) { /* dup2: not close-on-exec */
            int e = errno;
            (void)!write(execp[1], &e, sizeof(e));
            _exit(127);
        }
        int progfd = -1;
        if (s->confine && s->argv) {
            progfd = program ? open(program, O_PATH | (script ? 0 : O_CLOEXEC)) : -1;
            if (progfd < 0) {
                int e = program ? errno : ENOENT;
                (void)!write(execp[1], &e, sizeof(e));
                _exit(127);
            }
        }
        if (s->confine) {
            int cr = confine_self(s->confine);
            if (cr < 0) {
                int e = -cr;
                if (execp[1] >= 0)
                    (void)!write(execp[1], &e, sizeof(e));
                _exit(126);
            }
        }
        if (s->fn)
            _exit(s->fn(s->arg)); /* no atexit handlers, no leak check of the parent's heap */
        char *const *envp = s->envp ? s->envp : environ;
        if (progfd >= 0)
            syscall(SYS_execveat, progfd, "", s->argv, envp, AT_EMPTY_PATH);
        else
            execvpe(s->argv[0], s->argv, envp);
        int e = errno;
        (void)!write(execp[1], &e, sizeof(e));
        _exit(127);
    }
    if (execp[1] >= 0)
        close(execp[1]);
    int pidfd = pidfd_open_pid(pid);
    if (pidfd < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0); /* SIGKILL of our own fresh child: prompt */
        if (execp[0] >= 0)
            close(execp[0]);
        return pidfd;
    }
    *ret_pid = pid;
    *ret_pidfd = pidfd;
    if (ret_exec_fd)
        *ret_exec_fd = execp[0];
    else if (execp[0] >= 0)
        close(execp[0]);
    return 0;
}

int proc_exec_error(int exec_fd)
{
    int e = 0;
    if (exec_fd < 0)
        return 0;
    int fl = fcntl(exec_fd, F_GETFL);
    if (fl >= 0 && !(fl & O_NONBLOCK))
        fcntl(exec_fd, F_SETFL, fl | O_NONBLOCK);
    return read(exec_fd, &e, sizeof(e)) == (ssize_t)sizeof(e) ? e : 0;
}

static int run(char *const argv[], char *const envp[], uint64_t timeout_ms,
               const struct confine *confine, int (*tick)(void *arg), void *arg,
               struct proc_result *ret);

int proc_run(char *const argv[], uint64_t timeout_ms, struct proc_result *ret)
{
    return run(argv, NULL, timeout_ms, NULL, NULL, NULL, ret);
}

int proc_run_env(char *const argv[], char *const envp[], uint64_t timeout_ms,
                 struct proc_result *ret)
{
    return run(argv, envp, timeout_ms, NULL, NULL, NULL, ret);
}

int proc_run_watch(char *const argv[], uint64_t timeout_ms, int (*tick)(void *arg), void *arg,
                   struct proc_result *ret)
{
    return run(argv, NULL, timeout_ms, NULL, tick, arg, ret);
}

int proc_run_confined(char *const argv[], uint64_t timeout_ms, const struct confine *confine,
                      struct proc_result *ret)
{
    return run(argv, NULL, timeout_ms, confine, NULL, NULL, ret);
}

static int run(char *const argv[], char *const envp[], uint64_t timeout_ms,
               const struct confine *confine, int (*tick)(void *arg), void *arg,
               struct proc_result *ret)
{
    int outp[2], errp[2];
    if (pipe2(outp, O_CLOEXEC) < 0)
        return -errno;
    if (pipe2(errp, O_CLOEXEC) < 0) {
        int e = -errno;
        close(outp[0]), close(outp[1]);
        return e;
    }
    /* A helper (qemu-img) does not outlive its caller: a killed caller must
     * not leave it writing into the pool. */
    struct proc_spawn sp = PROC_SPAWN_INIT;
    sp.argv = argv;
    sp.envp = envp;
    sp.stdout_fd = outp[1];
    sp.stderr_fd = errp[1];
    sp.die_with_parent = true;
    sp.confine = confine;
    pid_t pid;
    int pidfd, execfd;
    int r = proc_spawn(&sp, &pid, &pidfd, &execfd);
    close(outp[1]);
    close(errp[1]);
    if (r < 0) {
        close(outp[0]), close(errp[0]);
        return r;
    }
    struct capture out = {.fd = outp[0]}, err = {.fd = errp[0]};
    fcntl(out.fd, F_SETFL, O_NONBLOCK);
    fcntl(err.fd, F_SETFL, O_NONBLOCK);
    uint64_t deadline = now_ms() + timeout_ms;
    bool exited = false, killed = false;
    int stopped = 0; /* tick's verdict */
    uint64_t next_tick = now_ms() + 1000;
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    while (!exited || out.fd >= 0 || err.fd >= 0) {
        struct pollfd fds[3];
        int nfds = 0;
        if (out.fd >= 0)
            fds[nfds++] = (struct pollfd){.fd = out.fd, .events = POLLIN};
        if (err.fd >= 0)
            fds[nfds++] = (struct pollfd){.fd = err.fd, .events = POLLIN};
        if (!exited)
            fds[nfds++] = (struct pollfd){.fd = pidfd, .events = POLLIN};
        uint64_t now = now_ms();
        int wait = now >= deadline ? 0 : (int)MIN(deadline - now, 1000u);
        int pr = poll(fds, (nfds_t)nfds, wait);
        if (pr < 0 && errno != EINTR)
            break;
        if (out.fd >= 0)
            capture_read(&out);
        if (err.fd >= 0)
            capture_read(&err);
        if (!exited && waitid(P_PIDFD, (id_t)pidfd, &si, WEXITED | WNOHANG) == 0 && si.si_pid)
            exited = true;
        if (!exited && !killed && tick && now_ms() >= next_tick) {
            next_tick = now_ms() + 1000;
            if ((stopped = tick(arg)) < 0) {
                pidfd_signal(pidfd, SIGKILL);
                killed = true;
                deadline = now_ms() + 5000;
                continue;
            }
        }
        if (!exited && now_ms() >= deadline && !killed) {
            pidfd_signal(pidfd, SIGKILL);
            killed = true;
            deadline = now_ms() + 5000; /* bound the wait for the reap too */
        } else if (now_ms() >= deadline && killed) {
            break;
        }
    }
    if (out.fd >= 0)
        close(out.fd);
    if (err.fd >= 0)
        close(err.fd);
    int exec_errno = exited ? proc_exec_error(execfd) : 0;
    close(execfd);
    close(pidfd);
    if (exec_errno) {
        free(out.buf);
        free(err.buf);
        return -exec_errno;
    }
    ret->out = out.buf ? out.buf : xstrdup("");
    ret->err = err.buf ? err.buf : xstrdup("");
    ret->exit_code = si.si_code == CLD_EXITED ? si.si_status : 128 + si.si_status;
    if (killed || !exited) {
        proc_result_clear(ret);
        return stopped < 0 ? stopped : -ETIMEDOUT;
    }
    return 0;
}

const char *proc_last_line(const char *text, char *buf, size_t len)
{
    const char *end = text + strlen(text);
    while (end > text && (end[-1] == '\n' || end[-1] == '\r' || end[-1] == ' '))
        end--;
    const char *start = end;
    while (start > text && start[-1] != '\n')
        start--;
    snprintf(buf, len, "%.*s", (int)(end - start), start);
    return buf;
}

/* /proc/PID/NAME, at most max bytes. */
static int read_proc(pid_t pid, const char *name, size_t max, char **ret, size_t *ret_len)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, name);
    return read_file(path, max, ret, ret_len);
}

int proc_stat_fields(pid_t pid, int first, int n, uint64_t *ret)
{
    _cleanup_free_ char *data = NULL;
    int r = read_proc(pid, "stat", 65536, &data, NULL);
    if (r < 0)
        return r;
    /* comm may contain spaces and parentheses: skip to the last ')'. */
    char *p = strrchr(data, ')');
    if (!p || first < 4 || n < 1)
        return -EINVAL;
    p++;
    /* Fields after comm start at field 3 (state); field f + 1 follows the
     * space found at step f. */
    for (int field = 3; field + 1 < first + n; field++) {
        p = strchr(p + 1, ' ');
        if (!p)
            return -EINVAL;
        if (field + 1 >= first)
            ret[field + 1 - first] = strtoull(p + 1, NULL, 10);
    }
    return 0;
}

int proc_starttime(pid_t pid, uint64_t *ret) { return proc_stat_fields(pid, 22, 1, ret); }

/* Whether pid is alive (not a zombie) and in process group pgid. */
static bool in_group(pid_t pid, pid_t pgid)
{
    _cleanup_free_ char *data = NULL;
    if (read_proc(pid, "stat", 65536, &data, NULL) < 0)
        return false;
    const char *p = strrchr(data, ')');
    char state;
    int ppid, pgrp;
    if (!p || sscanf(p + 1, " %c %d %d", &state, &ppid, &pgrp) != 3)
        return false;
    return pgrp == pgid && state != 'Z' && state != 'X';
}

int proc_group_wait(pid_t pgid, uint64_t timeout_ms)
{
    uint64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        bool any = false;
        DIR *d = opendir("/proc");
        if (!d)
            return -errno;
        struct dirent *de;
        while (!any && (de = readdir(d))) {
            uint64_t pid;
            if (parse_uint(de->d_name, 1, INT32_MAX, &pid) == 0)
                any = in_group((pid_t)pid, pgid);
        }
        closedir(d);
        if (!any)
            return 0;
        if (now_ms() >= deadline)
            return -ETIMEDOUT;
        sleep_ms(5);
    }
}

int proc_io(pid_t pid, struct proc_io *ret)
{
    _cleanup_free_ char *data = NULL;
    int r = read_proc(pid, "io", 4096, &data, NULL);
    if (r < 0)
        return r;
    static const char *const keys[] = {"read_bytes: ", "write_bytes: ", "syscr: ", "syscw: "};
    uint64_t *out[] = {&ret->read_bytes, &ret->write_bytes, &ret->syscr, &ret->syscw};
    for (size_t i = 0; i < ARRAY_SIZE(keys); i++) {
        const char *p = strstr(data, keys[i]);
        if (!p || (p != data && p[-1] != '\n'))
            return -EBADMSG;
        *out[i] = strtoull(p + strlen(keys[i]), NULL, 10);
    }
    uint64_t t[2];
    if ((r = proc_stat_fields(pid, 14, 2, t)) < 0)
        return r;
    long hz = sysconf(_SC_CLK_TCK);
    ret->cpu_seconds = (double)(t[0] + t[1]) / (double)(hz > 0 ? hz : 100);
    return 0;
}

int proc_cmdline(pid_t pid, char **ret, size_t *ret_len)
{
    return read_proc(pid, "cmdline", 1 << 20, ret, ret_len);
}
