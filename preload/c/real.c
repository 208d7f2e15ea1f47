/* real.c: resolves the real libc functions once, in the constructor or at the first
 * interposed call that comes earlier. */
#include "real.h"

#include <dlfcn.h>
#include <pthread.h>

struct real_fns real;
volatile int real_ready;

static pthread_once_t real_once = PTHREAD_ONCE_INIT;

#define RESOLVE(field, sym) (*(void **)&real.field = dlsym(RTLD_NEXT, sym))

static void resolve(void)
{
	RESOLVE(socket, "socket");
	RESOLVE(syscall, "syscall");
	RESOLVE(connect, "connect");
	RESOLVE(listen, "listen");
	RESOLVE(accept, "accept");
	RESOLVE(accept4, "accept4");
	RESOLVE(close, "close");
	RESOLVE(shutdown, "shutdown");
	RESOLVE(read, "read");
	RESOLVE(readv, "readv");
	RESOLVE(recv, "recv");
	RESOLVE(recvfrom, "recvfrom");
	RESOLVE(recvmsg, "recvmsg");
	RESOLVE(recvmmsg, "recvmmsg");
	RESOLVE(write, "write");
	RESOLVE(writev, "writev");
	RESOLVE(send, "send");
	RESOLVE(sendto, "sendto");
	RESOLVE(sendmsg, "sendmsg");
	RESOLVE(sendmmsg, "sendmmsg");
	RESOLVE(sendfile, "sendfile");
	RESOLVE(sendfile64, "sendfile64");
	RESOLVE(splice, "splice");
	RESOLVE(fcntl, "fcntl");
	RESOLVE(fcntl64, "fcntl64");
	RESOLVE(ioctl, "ioctl");
	RESOLVE(getsockopt, "getsockopt");
	RESOLVE(setsockopt, "setsockopt");
	RESOLVE(getsockname, "getsockname");
	RESOLVE(dup, "dup");
	RESOLVE(dup2, "dup2");
	RESOLVE(dup3, "dup3");
	RESOLVE(epoll_create, "epoll_create");
	RESOLVE(epoll_create1, "epoll_create1");
	RESOLVE(epoll_ctl, "epoll_ctl");
	RESOLVE(epoll_wait, "epoll_wait");
	RESOLVE(epoll_pwait, "epoll_pwait");
	RESOLVE(epoll_pwait2, "epoll_pwait2");
	RESOLVE(poll, "poll");
	RESOLVE(ppoll, "ppoll");
	RESOLVE(select, "select");
	RESOLVE(pselect, "pselect");
	RESOLVE(read_chk, "__read_chk");
	RESOLVE(recv_chk, "__recv_chk");
	RESOLVE(recvfrom_chk, "__recvfrom_chk");
	RESOLVE(poll_chk, "__poll_chk");
	RESOLVE(execve, "execve");
	RESOLVE(execvpe, "execvpe");
	RESOLVE(fexecve, "fexecve");
	RESOLVE(execveat, "execveat");
	RESOLVE(posix_spawn, "posix_spawn");
	RESOLVE(posix_spawnp, "posix_spawnp");
	RESOLVE(posix_spawn_file_actions_init, "posix_spawn_file_actions_init");
	RESOLVE(posix_spawn_file_actions_destroy, "posix_spawn_file_actions_destroy");
	RESOLVE(posix_spawn_file_actions_addclose, "posix_spawn_file_actions_addclose");
	RESOLVE(posix_spawn_file_actions_addopen, "posix_spawn_file_actions_addopen");
	RESOLVE(posix_spawn_file_actions_adddup2, "posix_spawn_file_actions_adddup2");
	RESOLVE(posix_spawn_file_actions_addclosefrom_np, "posix_spawn_file_actions_addclosefrom_np");
	RESOLVE(system, "system");
	RESOLVE(popen, "popen");
	if (!real.fcntl64)
		real.fcntl64 = real.fcntl;
	if (!real.sendfile64)
		real.sendfile64 = real.sendfile;
	__atomic_store_n(&real_ready, 1, __ATOMIC_RELEASE);
}

void real_init(void)
{
	pthread_once(&real_once, resolve);
}
