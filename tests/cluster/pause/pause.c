/* The pod sandbox's process (what Kubernetes' pause image runs), built statically by
 * tests/cluster/node_images.py: it holds the pod's namespaces, reaps the zombies the pod's
 * containers leave to it, and exits on SIGINT or SIGTERM. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signum) { _exit(0); }

static void reap(int signum) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    if (getpid() != 1) {
        return 1; /* only as a container's first process */
    }
    if (sigaction(SIGINT, &on_stop, NULL) < 0 || sigaction(SIGTERM, &on_stop, NULL) < 0 ||
        sigaction(SIGCHLD, &on_child, NULL) < 0) {
        return 2;
    }
    for (;;) {
        pause();
    }
}
