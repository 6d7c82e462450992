/* LD_PRELOAD shim: flock() on files under $LDH_NOLOCK_DIR fails with ENOLCK, as on a filesystem mounted without
 * locking (NFS with 'nolock', Lustre without -o flock). With LDH_NOLOCK_MODE=noop it succeeds instead without
 * locking anything, as on a filesystem whose locks do not cross nodes (Lustre's localflock) seen from two nodes.
 * Everything else reaches the real flock(). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

int flock(int fd, int operation) {
    static int (*real_flock)(int, int);
    if (real_flock == NULL) real_flock = (int (*)(int, int))dlsym(RTLD_NEXT, "flock");
    const char *directory = getenv("LDH_NOLOCK_DIR");
    if (directory != NULL && !(operation & LOCK_UN)) {
        char link[64], target[PATH_MAX];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t length = readlink(link, target, sizeof target - 1);
        if (length > 0) {
            target[length] = '\0';
            if (strncmp(target, directory, strlen(directory)) == 0) {
                const char *mode = getenv("LDH_NOLOCK_MODE");
                if (mode != NULL && strcmp(mode, "noop") == 0) return 0;
                errno = ENOLCK;
                return -1;
            }
        }
    }
    return real_flock(fd, operation);
}
