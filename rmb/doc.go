// Package rmb is the remote-memory-buffer layer of SMC-R: cursors with wrap counts,
// the ring accounting both ends of a connection keep over an RMB element (RMBE), RMBE
// size codes, and the CDC message codec (RFC 7609 "Connection Data Control").
//
// Everything here is pure: no memory is owned, no I/O, no goroutines, no clocks. It
// is the only implementation of the ring and cursor arithmetic: the engine's
// connection (package smcr, Conn.tx and Conn.rx) moves bytes with RDMA WRITE and
// holds one [Producer] (its writes into the peer's RMBE) and one [Consumer] (the
// peer's writes into its own RMBE), and the direct mode's shared rings ([Shared])
// are split with the same [Split]. The shared area that smcrd and
// libsmcr-preload.so map is laid out here too, as a versioned ABI (the last
// section).
//
// # The ring
//
// An RMBE of size S is a ring addressed by a [Cursor]: a byte offset Count in [0, S)
// and a 16-bit Wrap count that grows each time Count passes the end. Producer and
// Consumer keep positions instead: 64-bit counts of the bytes of the stream before a
// cursor, which never wrap ([CursorAt] gives a position's cursor; [Cursor.Pos] takes
// a peer's cursor back to a position, relative to the last one accepted, and tells a
// stale one). The producer sees the peer's RMBE like this:
//
//	              peer's RMBE (size S), as the producer sees it
//	   ┌───────────────────────────────────────────────────────────┐
//	   │ free │ written, unconsumed                │ free           │
//	   └───────────────────────────────────────────────────────────┘
//	          ▲ peer consumer cursor               ▲ my producer cursor
//	          (last CDC from the peer)             (next byte I write)
//
//	free = S − (producer − peer consumer)
//
// # The producer limit
//
// The producer may fill the whole RMBE: free is S, not S − 1, when the peer has
// consumed everything. Wrap counts tell a full ring (producer one wrap ahead of the
// consumer, same Count) from an empty one (same Wrap and Count), so no byte is kept
// free as in rings with bare offsets. RFC 7609 lets the sender write until the RMBE
// is full (then its CDC says "write blocked"), and Linux does the same: smc_tx.c writes up
// to conn->peer_rmbe_space, which starts at the peer's RMBE size and grows by
// smc_curs_diff between the consumer cursors of two CDCs (smc_cdc.c,
// smc_cdc_msg_recv_action), and smc_curs_diff (smc_cdc.h) counts a full ring
// (different wraps, equal counts) as S bytes.
//
// The consumer's check of the peer's producer cursor follows from that: the peer
// knows only the consumer cursor it was last sent, so it may write at most S bytes
// past the consumer cursor this end last reported ([Consumer.Report]), not past the
// one it has read up to since. A producer cursor beyond that limit is an error
// ([Consumer.CheckPeerProducer]); no correct peer, Linux's included, writes there.
//
// The consumer reads between its own consumer cursor and the producer cursor the peer
// last sent, and remembers the consumer cursor it last reported (the peer may write up
// to one ring past that, never further). It reports its consumer cursor back only
// once at least 10% of the RMBE has been consumed since its last report, or when the
// peer asks with the "cursor update requested" flag, or after an urgent byte
// ([Consumer.UpdateDue]), so a bulk transfer costs one CDC per tenth of the ring, not
// one per read. Every CDC carries the consumer cursor, so every CDC is a report.
//
// # CDC message (44 bytes, RDMA SEND, all integers big-endian)
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|  type = 0xFE  |  length = 44  |        sequence number        |  0
//	+---------------+---------------+-------------------------------+
//	|                alert token of the receiving RMBE              |  4
//	+-------------------------------+-------------------------------+
//	|           reserved            |   producer cursor wrap count  |  8
//	+-------------------------------+-------------------------------+
//	|                 producer cursor count (offset)                |  12
//	+-------------------------------+-------------------------------+
//	|           reserved            |   consumer cursor wrap count  |  16
//	+-------------------------------+-------------------------------+
//	|                 consumer cursor count (offset)                |  20
//	+---------------+---------------+-------------------------------+
//	|producer flags |  conn. state  |                               |  24
//	+---------------+---------------+                               +
//	|                reserved (bytes 26 to 43, 18 bytes)            |  28
//	~                                                               ~
//	+---------------------------------------------------------------+  44
//
//	producer flags  0x80 write blocked        conn. state  0x80 sending done
//	                0x40 urgent data pending               0x40 connection closed
//	                0x20 urgent data present               0x20 abnormal close
//	                0x10 cursor update requested
//	                0x08 failover validation
//
// The producer cursor is where the sender's next byte will go in the receiver's RMBE;
// the consumer cursor is how far the sender has consumed its own RMBE. Reserved bytes
// and bits are sent as zero and ignored on receipt, as Linux does (net/smc/smc_cdc.h,
// struct smc_cdc_msg).
//
// # The direct mode's shared area (ABI version [ABIVersion])
//
// smcrd and libsmcr-preload.so share one memfd per connection (sealed against
// resizing, mapped MAP_SHARED by both); [Shared] is the Go view and
// preload/smcr_abi.h (struct smcr_shared) the C one, and a test compiles the header
// and compares every offset. Any change to the layout or the meaning of a field
// bumps [ABIVersion] in both; the library refuses an area of another version. The
// ring offsets are in the header: the C side accepts any that lie after the
// control words, inside map_size and apart, while [InitShared] places them as
// below. All integers are host byte order; 32-bit words are read and written
// atomically, cursors are 64-bit atomics.
//
//	offset  written by   field
//	     0  smcrd, once  magic "SMCS" u32, version u32, tx_size u32, rx_size u32,
//	                     tx_off u32, rx_off u32, map_size u32, ring_files u32
//	    64  library      tx_prod u64, rx_cons u64, lib_flags u32, lib_seq u32,
//	                     lib_waiters u32, lib_pollers u32, tx_urg u64 (96),
//	                     rx_oob u64 (104, the library's own), lib_owner i32 (112),
//	                     lib_pidns u64 (120)
//	   128  smcrd        tx_cons u64, rx_prod u64, d_flags u32, d_errno i32,
//	                     d_seq u32, d_txwait u32, d_rxwait u32, rx_urg u64 (168)
//	   192  library      lib_ring_ops u32, lib_releasing u32 (196): the library's
//	                     own, shared by the processes that hold the connection
//	                     since a fork or an exec; smcrd ignores them
//	   256  (reserved to the end of the 4096-byte control page)
//	  4096  send ring (tx_size bytes, at tx_off), then the receive ring (rx_size
//	        bytes, at rx_off = 4096 + tx_size rounded up to a page)
//
// With ring_files = [SharedRingFiles] ([InitSharedRingFiles]) the area is the
// control page alone and the rings are in files of their own, passed beside it;
// tx_off and rx_off are offsets in those files.
//
// Cursors in the shared area are positions, as above: absolute byte counts whose
// place in a ring is the count modulo the ring's size ([Split]). The send ring is
// written by the library between tx_cons and tx_cons + tx_size, and its bytes up to
// tx_prod are taken by smcrd; the receive ring is written by smcrd up to rx_cons +
// rx_size and read by the library up to rx_prod. A side copies its bytes first and
// stores its cursor after, with release order; the other loads the cursor with
// acquire order, then copies. smcrd ends a connection whose library's cursor
// claims more than its ring holds. lib_flags carries [LibShutWR] and [LibClosed]; d_flags
// carries [DEOF], [DError] (d_errno for reads and writes) and [DTxClosed].
//
// Urgent data (TCP's MSG_OOB): tx_urg and rx_urg are stream positions just past
// the latest urgent byte of each direction (0: none yet), stored before the
// tx_prod or rx_prod that covers the byte, so that a side that sees the cursor
// sees the mark; only the latest mark counts, as TCP's one urgent pointer. The
// urgent byte stays in the ring: the library reads it for recv(MSG_OOB) and
// skips it in the stream unless the program set SO_OOBINLINE, and keeps in rx_oob
// the rx_urg whose byte it took. smcrd posts the byte at tx_urg - 1 as SMC-R's
// urgent data (or TCP's after a continuation) and publishes the peer's mark.
// A new mark sends SIGURG to the socket's owner (F_SETOWN), before the rx_prod
// that covers it: smcrd finds the owner on its duplicate of the socket; with
// SHM the peer library signals lib_owner, if lib_pidns is its pid namespace.
//
// Waking: smcrd bumps d_seq after each publish and wakes futex waiters on it while
// lib_waiters is nonzero, and writes the library's process eventfd (one per process,
// passed with CLIENT and ACCEPTED) while lib_pollers is; the library writes smcrd's
// send eventfd after moving tx_prod or lib_flags while d_txwait is set, and its
// receive eventfd after moving rx_cons while d_rxwait is. smcrd's eventfds travel
// beside the memfd (preload/smcr_abi.h, enum smcr_mode).
//
// The policy page (struct smcr_policy, [Policy]) is a second, read-only mapping with
// the same version: magic "SMCP", version, smcrd's heartbeat, the enabled word and
// the port bitmap of port_range_list (layout in shared.go).
package rmb
