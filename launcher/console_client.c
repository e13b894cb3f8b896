/* SPDX-License-Identifier: Apache-2.0 */
/* console_client.c: `qsd-vm-launcher console`, attach to a running VM's
 * serial console through the launcher's attach socket (console.h).
 *
 * Owns: the client's command line, the terminal (raw while attached when
 * stdin is a terminal, restored on every exit path) and the copy loop:
 * stdin -> console, console -> stdout.  Ctrl-] on stdin detaches (the VM
 * keeps running); end of stdin detaches too, so scripts can pipe commands. */
#include "console.h"
#include "qsd/base/util.h"

#include <getopt.h>
#include <poll.h>
#include <termios.h>

static void client_usage(FILE *f)
{
    fprintf(f, "Usage: qsd-vm-launcher console [--root DIR | --socket PATH]\n"
               "Attach to the VM's serial console; Ctrl-] detaches (the VM keeps running).\n\n"
               "  -r, --root DIR      the launcher's --root (default /var/lib/qsd-vm-launcher):\n"
               "                      the console is DIR/console.sock\n"
               "  -S, --socket PATH   the launcher's --console-socket, if it was given\n"
               "  -h, --help          this help\n");
}

static struct termios saved;
static bool raw_mode;

static void restore_tty(void)
{
    if (raw_mode)
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved);
    raw_mode = false;
}

int console_client_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"root", required_argument, NULL, 'r'},
        {"socket", required_argument, NULL, 'S'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    const char *root = "/var/lib/qsd-vm-launcher", *sock = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "r:S:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'r': root = optarg; break;
        case 'S': sock = optarg; break;
        case 'h': client_usage(stdout); return 0;
        default: client_usage(stderr); return 2;
        }
    }
    if (optind != argc) {
        client_usage(stderr);
        return 2;
    }
    _cleanup_free_ char *path = sock ? xstrdup(sock) : xasprintf("%s/console.sock", root);
    int fd;
    int r = unix_connect(path, false, &fd);
    if (r < 0) {
        fprintf(stderr, "qsd-vm-launcher console: cannot connect to %s: %s (is the VM running?)\n",
                path, strerror(-r));
        return 1;
    }
    bool tty = isatty(STDIN_FILENO);
    if (tty && tcgetattr(STDIN_FILENO, &saved) == 0) {
        struct termios t = saved;
        cfmakeraw(&t);
        if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &t) == 0) {
            raw_mode = true;
            atexit(restore_tty);
        }
        fprintf(stderr, "Connected to the VM's console (%s); Ctrl-] detaches.\r\n", path);
    }
    struct pollfd p[2] = {{.fd = STDIN_FILENO, .events = POLLIN}, {.fd = fd, .events = POLLIN}};
    int status = 0;
    char buf[4096];
    for (;;) {
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            status = 1;
            break;
        }
        if (p[1].revents) {
            ssize_t n = read(fd, buf, sizeof(buf));
            if (n <= 0) {
                restore_tty();
                fprintf(stderr, "\nqsd-vm-launcher console: the console closed\n");
                status = n < 0 ? 1 : 0;
                break;
            }
            if (write_all(STDOUT_FILENO, buf, (size_t)n) < 0) {
                status = 1;
                break;
            }
        }
        if (p[0].revents) {
            ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
            if (n <= 0)
                break; /* end of input: detach */
            char *esc = memchr(buf, CONSOLE_DETACH_CHAR, (size_t)n);
            size_t len = esc ? (size_t)(esc - buf) : (size_t)n;
            if (len && write_all(fd, buf, len) < 0) {
                status = 1;
                break;
            }
            if (esc)
                break;
        }
    }
    restore_tty();
    if (tty)
        fprintf(stderr, "\r\nDetached from the VM's console.\n");
    close(fd);
    return status;
}
