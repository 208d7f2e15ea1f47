// Package soft is the software verbs provider: RC queue-pair semantics emulated in
// user space over TCP, for development, CI and hosts without RDMA. It is slower
// than plain TCP and never chosen unless configured (RFC 7609 assumes RoCE; this
// stands in for the RNIC of §2.1 and checks remote access as one would).
//
// # Addressing
//
// A device listens on a TCP address (Config.ListenAddr, default "127.0.0.1:0").
// Its Endpoint, which travels in QPAttr.Endpoint, is that address as text
// ("198.18.0.1:40123", "[fd00::1]:40123"). The port's GID is the listen IP in
// IPv6 form (IPv4-mapped for IPv4, as RoCE v2 derives it), its MAC that of
// Config.Netdev or of the interface holding the listen IP.
//
// # Streams
//
// Each direction of a connected QP pair is one TCP connection, opened by the
// requester's Connect to the responder's device: requests flow on it one way,
// ACKs and NAKs the other. A QP therefore has an outbound stream (its sends) and
// an inbound one (its peer's sends). Connect's stream starts with a hello naming
// the target QP; the device attaches it to that QP, answers, and the QP checks, once
// it is itself connected, that the hello came from the QP and PSN it was given.
// Until then it holds up to four such streams, so a stranger's hello cannot keep
// the peer's out, and QPNs are random, so naming one takes a guess. Connect
// dials only an IP address and port: the endpoint is the peer's word.
//
// # Frames
//
// Every frame is a 28-byte header, big-endian, followed by length payload bytes:
//
//	 0      1          2          4                       8
//	+------+----------+----------+-----------------------+
//	| type | syndrome | reserved |  PSN (24 bits in 32)  |
//	+------+----------+----------+-----------------------+
//	|          remote address (64), WRITE*; hello: QPNs   |  8
//	+----------------------------+-----------------------+
//	|     rkey (32); hello magic  | immediate (32); hello |  16
//	|                             | version               |
//	+----------------------------+-----------------------+
//	|  length (32): payload bytes |                          24
//	+----------------------------+ payload ...
//
//	type 1 WRITE        addr, rkey, length, payload
//	     2 WRITE_IMM    addr, rkey, imm, length, payload (consumes a RECV)
//	     3 SEND         length, payload (consumes a RECV)
//	    16 ACK          PSN of the executed request
//	    17 NAK          PSN and syndrome: 1 RNR, 2 remote access, 3 invalid
//	                    request (RECV too small), 4 remote operation error
//	    32 HELLO        PSN = the requester's initial PSN, addr = src QPN << 32 |
//	                    dst QPN, rkey = "SOFT", imm = 1 (version)
//	    33 HELLO_OK     PSN echoed
//
// Fields a type does not use are zero; anything else is a malformed frame.
//
// # Semantics
//
// Requests carry consecutive PSNs from the requester's initial PSN and are
// executed in order. The responder checks a WRITE's rkey (it must name a region of
// the QP's own protection domain with remote-write access) and bounds before it
// reads the payload into the region; a violation is NAKed, the payload discarded,
// nothing written. A SEND or WRITE WITH IMM with no RECV posted gets an RNR NAK:
// the requester waits Config.RNRTimer and resends from that request (go-back-N;
// the responder drops what follows a NAKed request until it comes again), giving up
// with WCRNRRetryExcErr after QPConfig.RNRRetry NAKs (7: never). A remote access
// error, a too-small RECV or a malformed frame moves the QP to ERROR: outstanding
// work requests complete with WCWRFlushErr and both streams close, which the peer
// sees as retry exceeded. A frame that does not parse cannot touch memory: every
// write goes through the same rkey and bounds check, and one QP's failure closes
// only its own two streams. As an RNIC's, a QP that has left RTS executes nothing
// more, WRITEs already in its stream included: their payload reaches memory
// through a bounce buffer, each piece copied only while the QP runs, and the
// copy is a device's DMA, outside the race detector's sight (dmaCopy).
//
// Buffers are reused: posting, sending, executing and completing a work request
// allocate nothing.
package soft
