// Package rmb is the remote-memory-buffer layer of SMC-R: cursors with wrap counts,
// the ring accounting both ends of a connection keep over an RMB element (RMBE), RMBE
// size codes, and the CDC message codec (RFC 7609 "Connection Data Control").
//
// Everything here is pure: no memory is owned, no I/O, no goroutines, no clocks. The
// connection layer moves bytes with RDMA WRITE and holds one [Producer] (its writes
// into the peer's RMBE) and one [Consumer] (the peer's writes into its own RMBE).
//
// # The ring
//
// An RMBE of size S is a ring addressed by a [Cursor]: a byte offset Count in [0, S)
// and a 16-bit Wrap count that grows each time Count passes the end. The producer
// sees the peer's RMBE like this:
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
// The consumer reads between its own consumer cursor and the producer cursor the peer
// last sent, and remembers the consumer cursor it last reported (the peer may write up
// to one ring past that, never further). It reports its consumer cursor back only once at least 10% of the RMBE has
// been consumed since its last report (or when the peer asks with the "cursor update
// requested" flag), so a bulk transfer costs one CDC per tenth of the ring, not one
// per read.
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
package rmb
