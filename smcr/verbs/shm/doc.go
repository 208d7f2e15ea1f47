// Package shm is the same-host verbs provider: RC queue pairs between processes
// (or network namespaces, or containers) on one machine, with memory regions in
// shared memory. It plays the part of the RNIC that RFC 7609 §2.1 assumes, the way
// SMC-D loopback does in Linux, behind the interface of package verbs.
//
// # Rendezvous and same-host detection
//
// A device listens on a file-system Unix socket (SOCK_SEQPACKET) under Config.Dir;
// abstract sockets would not do, they belong to one network namespace. The device's
// Endpoint, carried in smcr's CLC extension, names it:
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                  magic "SHM1" (53 48 4d 31)                   |
//	+---------------+---------------+-------------------------------+
//	|  version = 1  |  path length  |                               |
//	+---------------+---------------+                               |
//	|              boot_id (16 bytes, /proc/sys/kernel/random)      |
//	|                               +-------------------------------+
//	|                               |   socket inode (8 bytes) ...  |
//	+-------------------------------+-------------------------------+
//	|   ... socket inode            |   socket st_dev (8 bytes) ... |
//	+-------------------------------+-------------------------------+
//	|   ... socket st_dev           |  path (absolute, 1..107 bytes)
//	+-------------------------------+-------------------------------+
//
// Connect checks that the boot ID is this kernel's (same host: namespaces and
// containers share it, VMs and other machines do not) and that the path, seen from
// here, is the very socket the peer created (same inode and device), which also
// proves the two ends share that file system. Otherwise it fails with
// ErrNotSameHost and the caller picks another provider.
//
// # Connecting a QP pair
//
// Both ends call Connect with the other's QPAttr. The end with the smaller
// (st_dev, inode, QPN) dials the other's socket; the connection belongs to that QP
// pair. Control messages, one per packet, big-endian:
//
//	hello, hello-ack (28 bytes; 1 fd: the sender's queue segment)
//	  type(1) 0(3) | dst QPN(4) | src QPN(4) | src socket inode(8) | segment size(4) | RNR retry(1) 0(3)
//	doorbell (4):    type 0(3)
//	map request (8): type 0(3) | rkey(4)
//	map reply (28):  type 0(3) | rkey(4) | status(1) access(1) 0(2) | addr(8) | size(8); 1 fd when status 0
//	revoke (8):      type 0(3) | rkey(4)
//
// The socket is also how a peer's death is seen: when it closes, outstanding work
// requests are flushed (WCWRFlushErr) and the QP enters ERROR.
//
// # Memory regions
//
// AllocMR creates a memfd, sizes it, seals it against shrinking and growing
// (F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL: a peer holding it cannot truncate it under
// our mapping) and maps it; MR.Bytes is that mapping and MR.Addr its address. The
// first WRITE to an rkey asks the peer (map request on the QP's socket); the peer
// answers only for a region of the QP's own PD registered with remote access, with
// a descriptor that is read-write only if the region has AccessRemoteWrite (a
// read-only region gets a new read-only open file description, on which mmap
// PROT_WRITE fails). The requester refuses descriptors that are not sealed memfds of
// at least the announced size. Deregistering a region sends revoke to every peer
// that was handed it; they unmap it, and later WRITEs fail with WCRemAccessErr.
//
// # Shared queues
//
// Each end creates one queue segment, a sealed memfd shared read-write with its
// peer, holding its request ring (single producer: the owner; single consumer: the
// peer). Fields each side writes sit on separate cache lines. Integers are in host
// byte order (both ends are on one host) and accessed atomically.
//
//	offset  size  writer  field
//	     0     4  owner   magic "SMQ2" (0x534d5132)
//	     4     4  owner   slots (= the owner's MaxSendWR)
//	     8     4  owner   slot size (16-byte header + MaxMsgSize, 64-aligned)
//	    64     8  owner   head: requests produced
//	   128     4  owner   sleeping: nonzero = ring my doorbell when you change something
//	                      (the peer clears it when it rings; the owner sets it again on the doorbell)
//	   192     8  peer    tail: requests consumed (the acknowledgement)
//	   200     8  peer    NAK sequence: the request that failed
//	   208     4  peer    NAK code: its WCStatus (RNR retry exceeded, remote invalid request)
//	   256            owner   slots[slots], each slot size bytes:
//	                            op(1: SEND, 2: WRITE WITH IMM) 0(3) | length(4) | imm(4) | 0(4) | SEND payload
//
// RDMA WRITE is a memcpy by the requester into its mapping of the peer's region,
// after the rkey, permission and bounds checks a responder RNIC makes (failure:
// WCRemAccessErr, nothing written, QP to ERROR); it completes at once, in order
// behind earlier requests. WRITE WITH IMM copies the data the same way and then
// queues a slot carrying the immediate. SEND copies its payload into a slot. The
// responder consumes slots in order into posted RECVs, advances tail (the requester
// then completes its work requests) and NAKs what it cannot take: no RECV for
// longer than the requester's RNR retries (7 waits forever), or a RECV too small.
//
// Everything read from a peer's segment is validated once and copied before use:
// head within one ring of our tail, slot opcode and length within the slot, tail
// between what we consumed and produced, NAK naming the request at tail. Any
// violation moves that QP (only) to ERROR; no value from shared memory is ever used
// as an index or length into our own memory unchecked.
//
// # Waiting: busy-poll, then doorbell
//
// CQ.Poll and the spin phase of CQ.Wait drive the queues of the QPs attached to the
// CQ directly, so a busy-polling pair exchanges messages with no syscall at all.
// Polling clears our sleeping flag; after the adaptive spin budget (at most
// Config.SpinMax), Wait sets it and sleeps. A producer that finds the peer's flag set
// clears it and sends a doorbell packet (MSG_DONTWAIT) on the socket, where the
// QP's goroutine sleeps in the netpoller; it sets the flag again while the owner
// still sleeps, then drives the queues and wakes CQ waiters: one doorbell per
// sleep, however many posts come before the goroutine runs. The flag is
// stored before the last look at the rings, and the producer publishes head before
// it reads the flag, so no wake-up is lost. When polling stops without a Wait, the
// goroutine re-arms the flag after a grace period of 2ms.
package shm
