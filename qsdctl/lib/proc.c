/* proc.c: see proc.h. */
#include "proc.h"
#include "util.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
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

int proc_run(char *const argv[], uint64_t timeout_ms, struct proc_result *ret)
{
    int outp[2], errp[2], execp[2];
    if (pipe2(outp, O_CLOEXEC) < 0)
        return -errno;
    if (pipe2(errp, O_CLOEXEC) < 0) {
        int e = -errno;
        close(outp[0]), close(outp[1]);
        return e;
    }
    if (pipe2(execp, O_CLOEXEC) < 0) {
        int e = -errno;
        close(outp[0]), close(outp[1]), close(errp[0]), close(errp[1]);
        return e;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = -errno;
        close(outp[0]), close(outp[1]), close(errp[0]), close(errp[1]);
        close(execp[0]), close(execp[1]);
        return e;
    }
    if (pid == 0) {
        /* A helper (qemu-img) does not outlive its caller: a killed caller
         * must not leave it writing into the pool. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int devnull = open("/dev/null", O_RDONLY);
        dup2(devnull, 0);
        dup2(outp[1], 1);
        dup2(errp[1], 2);
        execvp(argv[0], argv);
        int e = errno;
        (void)!write(execp[1], &e, sizeof(e));
        _exit(127);
    }
    close(outp[1]);
    close(errp[1]);
    close(execp[1]);
    int exec_errno = 0;
    ssize_t n = read(execp[0], &exec_errno, sizeof(exec_errno));
    close(execp[0]);

    struct capture out = {.fd = outp[0]}, err = {.fd = errp[0]};
    fcntl(out.fd, F_SETFL, O_NONBLOCK);
    fcntl(err.fd, F_SETFL, O_NONBLOCK);
    int pidfd = pidfd_open_pid(pid);
    uint64_t deadline = now_ms() + timeout_ms;
    bool exited = false, killed = false;
    int status = 0;
    while (!exited || out.fd >= 0 || err.fd >= 0) {
        struct pollfd fds[3];
        int nfds = 0;
        if (out.fd >= 0)
            fds[nfds++] = (struct pollfd){.fd = out.fd, .events = POLLIN};
        if (err.fd >= 0)
            fds[nfds++] = (struct pollfd){.fd = err.fd, .events = POLLIN};
        if (!exited && pidfd >= 0)
            fds[nfds++] = (struct pollfd){.fd = pidfd, .events = POLLIN};
        uint64_t now = now_ms();
        int wait = now >= deadline ? 0 : (int)MIN(deadline - now, 1000u);
        if (pidfd < 0 && !exited)
            wait = MIN(wait, 10); /* no pidfd: poll the child */
        int r = nfds ? poll(fds, (nfds_t)nfds, wait) : (sleep_ms((unsigned)wait), 0);
        if (r < 0 && errno != EINTR)
            break;
        if (out.fd >= 0)
            capture_read(&out);
        if (err.fd >= 0)
            capture_read(&err);
        if (!exited && waitpid(pid, &status, WNOHANG) == pid)
            exited = true;
        if (!exited && now_ms() >= deadline && !killed) {
            kill(pid, SIGKILL);
            killed = true;
            deadline = now_ms() + 5000; /* bound the wait for the reap too */
        } else if (now_ms() >= deadline && killed) {
            break;
        }
    }
    if (!exited)
        waitpid(pid, &status, 0);
    if (out.fd >= 0)
        close(out.fd);
    if (err.fd >= 0)
        close(err.fd);
    if (pidfd >= 0)
        close(pidfd);
    if (n == sizeof(exec_errno) && exec_errno) {
        free(out.buf);
        free(err.buf);
        return -exec_errno;
    }
    ret->out = out.buf ? out.buf : xstrdup("");
    ret->err = err.buf ? err.buf : xstrdup("");
    ret->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (killed) {
        proc_result_clear(ret);
        return -ETIMEDOUT;
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

int proc_starttime(pid_t pid, uint64_t *ret)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    _cleanup_free_ char *data = NULL;
    int r = read_file(path, 65536, &data, NULL);
    if (r < 0)
        return r;
    /* comm may contain spaces and parentheses: skip to the last ')'. */
    char *p = strrchr(data, ')');
    if (!p)
        return -EINVAL;
    p++;
    /* Fields after comm start at field 3 (state); starttime is field 22. */
    for (int field = 3; field < 22; field++) {
        p = strchr(p + 1, ' ');
        if (!p)
            return -EINVAL;
    }
    *ret = strtoull(p + 1, NULL, 10);
    return 0;
}

int proc_cmdline(pid_t pid, char **ret, size_t *ret_len)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    return read_file(path, 1 << 20, ret, ret_len);
}
