/* SPDX-License-Identifier: Apache-2.0 */
/* The test cluster's pod sandbox process: what registry.k8s.io/pause does,
 * built here because no registry is reachable.  It holds the pod's
 * namespaces, reaps the zombies a pod sharing its PID namespace leaves, and
 * exits 0 on SIGINT or SIGTERM.  Owns nothing else. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
        (void) sig;
        _exit(0);
}

static void on_child(int sig) {
        (void) sig;
        while (waitpid(-1, NULL, WNOHANG) > 0)
                ;
}

int main(int argc, char **argv) {
        struct sigaction stop = { .sa_handler = on_stop }, child = { .sa_handler = on_child };

        if (argc > 1 && strcmp(argv[1], "-v") == 0) {
                puts("pause (qsd-csi tests/k8s)");
                return 0;
        }
        if (getpid() != 1)
                fputs("pause: warning: not PID 1\n", stderr);
        child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
        if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0 ||
            sigaction(SIGCHLD, &child, NULL) < 0) {
                perror("pause: sigaction");
                return 1;
        }
        for (;;)
                pause();
}
