// abx-probe: tries, from inside the sandbox, what the baseline syscall
// policy denies, and prints one line per attempt: "NAME ok" or
// "NAME errno=ENAME". Built static into the e2e probe image (hack/images.sh).
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void report(const char *name, long rc) {
	if (rc < 0) printf("%s errno=%s\n", name, strerrorname_np(errno));
	else printf("%s ok\n", name);
	fflush(stdout);
}

// userns: a child in a new user and mount namespace mounts a tmpfs and
// runs a binary it copies there: the escape the policy exists to stop.
static int userns(void) {
	long pid = syscall(SYS_clone, CLONE_NEWUSER | CLONE_NEWNS | SIGCHLD, 0, 0, 0, 0);
	if (pid == 0) {
		report("child-mount", mount("tmpfs", "/tmp", "tmpfs", 0, "mode=1777"));
		execl("/bin/sh", "sh", "-c", "cp /bin/busybox /tmp/busybox && /tmp/busybox echo userns-exec-ran", (char *)0);
		_exit(127);
	}
	report("clone-newuser", pid);
	if (pid > 0) waitpid(pid, 0, 0);
	return 0;
}

static void *thread_main(void *arg) { return arg; }

int main(int argc, char **argv) {
	const char *what = argc > 1 ? argv[1] : "";
	if (!strcmp(what, "userns")) return userns();
	if (!strcmp(what, "unshare")) { report("unshare-newuser", unshare(CLONE_NEWUSER)); return 0; }
	if (!strcmp(what, "setns")) { report("setns", syscall(SYS_setns, 0, 0)); return 0; }
	if (!strcmp(what, "clone3")) {
		char args[88] = {0};
		report("clone3", syscall(SYS_clone3, args, sizeof args));
		return 0;
	}
	if (!strcmp(what, "mount")) { report("mount", mount("tmpfs", "/tmp", "tmpfs", 0, "")); return 0; }
	if (!strcmp(what, "memfd")) {
		int fd = memfd_create("payload", 0);
		report("memfd_create", fd);
		if (fd < 0) return 0;
		// Copy busybox in and run it from the memfd.
		FILE *in = fopen("/bin/busybox", "r");
		char buf[65536]; size_t n;
		while (in && (n = fread(buf, 1, sizeof buf, in)) > 0) write(fd, buf, n);
		char path[64]; snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
		execl(path, "busybox", "echo", "memfd-exec-ran", (char *)0);
		report("memfd-exec", -1);
		return 0;
	}
	if (!strcmp(what, "others")) {
		report("bpf", syscall(SYS_bpf, 0, 0, 0));
		report("keyctl", syscall(SYS_keyctl, 0, 0, 0, 0, 0));
		report("userfaultfd", syscall(SYS_userfaultfd, 0));
		report("perf_event_open", syscall(SYS_perf_event_open, 0, 0, -1, -1, 0));
		report("ptrace", syscall(SYS_ptrace, PTRACE_TRACEME, 0, 0, 0));
		report("process_vm_readv", syscall(SYS_process_vm_readv, getpid(), 0, 0, 0, 0, 0));
		report("pivot_root", syscall(SYS_pivot_root, "/", "/"));
		return 0;
	}
	if (!strcmp(what, "alloc") && argc > 2) {
		// Allocate and touch N MiB: a memory bomb, or its legitimate twin.
		long mib = atol(argv[2]);
		for (long i = 0; i < mib; i++) {
			char *p = malloc(1 << 20);
			if (!p) { report("alloc", -1); return 1; }
			memset(p, 1, 1 << 20);
		}
		printf("held %ld MiB\n", mib);
		return 0;
	}
	if (!strcmp(what, "dnsflood") && argc > 3) {
		// Open N TCP connections to the pod's resolver, each announcing a
		// 64 KiB frame and sending one byte, and hold them S seconds.
		int n = atoi(argv[2]), secs = atoi(argv[3]), open_ = 0;
		for (int i = 0; i < n; i++) {
			int fd = socket(AF_INET, SOCK_STREAM, 0);
			struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(53)};
			inet_pton(AF_INET, "169.254.53.53", &sa.sin_addr);
			if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) { if (fd >= 0) close(fd); continue; }
			unsigned char b[3] = {0xff, 0xff, 0};
			write(fd, b, 3);
			open_++;
		}
		printf("dnsflood opened %d\n", open_);
		fflush(stdout);
		sleep(secs);
		return 0;
	}
	if (!strcmp(what, "legit")) {
		// glibc's pthread_create tries clone3 first and falls back to clone
		// on ENOSYS; fork is clone without namespace flags.
		pthread_t t;
		int rc = pthread_create(&t, 0, thread_main, 0);
		if (rc == 0) pthread_join(t, 0);
		errno = rc;
		report("pthread_create", rc ? -1 : 0);
		pid_t pid = fork();
		if (pid == 0) _exit(0);
		report("fork", pid);
		if (pid > 0) waitpid(pid, 0, 0);
		return 0;
	}
	fprintf(stderr, "usage: abx-probe userns|unshare|setns|clone3|mount|memfd|others|legit|alloc MIB|dnsflood N SECS\n");
	return 2;
}
