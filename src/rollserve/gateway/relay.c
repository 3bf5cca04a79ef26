/* rollserve-relay: the gateway's door inside a sandbox whose network is off.
 *
 *   rollserve-relay PORT SOCKET [-C DIR] [-e NAME=VALUE]... -- ARGV...
 *
 * Listens on 127.0.0.1:PORT in the sandbox's own network namespace, starts ARGV (in DIR,
 * with the given variables added to its environment) and carries every connection made to
 * the port to the Unix socket SOCKET (the node's gateway, bound into the sandbox), byte for
 * byte, both ways. It exits with ARGV's status (128 + N when a signal N ended it) once ARGV
 * has ended; SIGTERM, SIGINT and SIGHUP are passed on to ARGV. Static, libc only, so that it
 * runs in any image. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_PAIRS 64
#define BUF 32768

struct half { char buf[BUF]; size_t len, off; int eof; };
struct pair { int fd[2]; struct half h[2]; int open; };  /* h[i]: read from fd[i], to fd[1-i] */

static struct pair pairs[MAX_PAIRS];
static volatile sig_atomic_t child = 0;

static void forward(int sig) { if (child > 0) kill(child, sig); }

static void die(const char *what) { fprintf(stderr, "rollserve-relay: %s: %s\n", what, strerror(errno)); exit(125); }

static void close_pair(struct pair *p) {
    close(p->fd[0]); close(p->fd[1]); p->open = 0;
}

static int connect_unix(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr;
    if (fd < 0) return -1;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, path, sizeof addr.sun_path - 1);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) { close(fd); return -1; }
    return fd;
}

static void pump(struct pair *p, int i) {  /* read what fd[i] has, for fd[1-i] */
    struct half *h = &p->h[i];
    if (h->len == 0 && !h->eof) {
        ssize_t n = read(p->fd[i], h->buf, BUF);
        if (n > 0) { h->len = (size_t)n; h->off = 0; }
        else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            h->eof = 1; shutdown(p->fd[1 - i], SHUT_WR);
        }
    }
}

static void drain(struct pair *p, int i) {  /* write what fd[i] gave to fd[1-i] */
    struct half *h = &p->h[i];
    while (h->len > 0) {
        ssize_t n = write(p->fd[1 - i], h->buf + h->off, h->len);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) return;
            close_pair(p); return;
        }
        h->off += (size_t)n; h->len -= (size_t)n;
    }
}

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: rollserve-relay PORT SOCKET [-C DIR] [-e NAME=VALUE]... -- ARGV...\n"); return 125; }
    int port = atoi(argv[1]);
    const char *socket_path = argv[2];
    const char *dir = NULL;
    int i = 3;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "-C") == 0 && i + 1 < argc) dir = argv[++i];
        else if (strcmp(argv[i], "-e") == 0 && i + 1 < argc) {
            char *entry = argv[++i], *eq = strchr(entry, '=');
            if (eq == NULL) { fprintf(stderr, "rollserve-relay: -e %s: no '='\n", entry); return 125; }
            *eq = '\0'; setenv(entry, eq + 1, 1); *eq = '=';
        } else { fprintf(stderr, "rollserve-relay: unknown option %s\n", argv[i]); return 125; }
    }
    if (i + 1 >= argc) { fprintf(stderr, "rollserve-relay: no command after --\n"); return 125; }
    char **command = argv + i + 1;

    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (listener < 0) die("socket");
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((unsigned short)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) < 0) die("bind 127.0.0.1");
    if (listen(listener, 128) < 0) die("listen");

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    sigaction(SIGTERM, &sa, NULL); sigaction(SIGINT, &sa, NULL); sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        signal(SIGPIPE, SIG_DFL);
        if (dir != NULL && chdir(dir) < 0) { fprintf(stderr, "rollserve-relay: cd %s: %s\n", dir, strerror(errno)); _exit(126); }
        execvp(command[0], command);
        fprintf(stderr, "rollserve-relay: %s: %s\n", command[0], strerror(errno));
        _exit(errno == ENOENT ? 127 : 126);
    }
    child = pid;

    struct pollfd fds[1 + 2 * MAX_PAIRS];
    int where[1 + 2 * MAX_PAIRS];
    for (;;) {
        int status;
        pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid) {
            if (WIFEXITED(status)) return WEXITSTATUS(status);
            return 128 + WTERMSIG(status);
        }
        int n = 0;
        fds[n].fd = listener; fds[n].events = POLLIN; where[n++] = -1;
        for (int k = 0; k < MAX_PAIRS; k++) {
            struct pair *p = &pairs[k];
            if (!p->open) continue;
            if (p->h[0].eof && p->h[1].eof && p->h[0].len == 0 && p->h[1].len == 0) { close_pair(p); continue; }
            for (int s = 0; s < 2; s++) {
                fds[n].fd = p->fd[s];
                fds[n].events = (p->h[s].len == 0 && !p->h[s].eof ? POLLIN : 0) | (p->h[1 - s].len > 0 ? POLLOUT : 0);
                where[n++] = 2 * k + s;
            }
        }
        int ready = poll(fds, (nfds_t)n, 200);
        if (ready < 0) { if (errno == EINTR) continue; die("poll"); }
        for (int j = 1; j < n; j++) {
            int k = where[j] / 2, s = where[j] % 2;
            struct pair *p = &pairs[k];
            if (!p->open || fds[j].revents == 0) continue;
            if (fds[j].revents & POLLOUT) drain(p, 1 - s);
            if (p->open && (fds[j].revents & (POLLIN | POLLHUP | POLLERR))) { pump(p, s); drain(p, s); }
        }
        if (fds[0].revents & POLLIN) {
            int client;
            while ((client = accept4(listener, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
                int slot = -1;
                for (int k = 0; k < MAX_PAIRS; k++) if (!pairs[k].open) { slot = k; break; }
                int upstream = slot < 0 ? -1 : connect_unix(socket_path);
                if (upstream < 0) { close(client); continue; }
                fcntl(upstream, F_SETFL, fcntl(upstream, F_GETFL) | O_NONBLOCK);
                memset(&pairs[slot], 0, sizeof pairs[slot]);
                pairs[slot].fd[0] = client; pairs[slot].fd[1] = upstream; pairs[slot].open = 1;
            }
        }
    }
}
