// Package llc is the codec for SMC-R Link Layer Control messages (RFC 7609 §3.8 and
// §4.7 "LLC messages"), byte for byte as Linux (net/smc/smc_llc.c, struct
// smc_llc_msg_*) and Wireshark's SMC dissector lay them out.
//
// LLC messages manage a link group: they confirm a new link (RC queue pair), add and
// delete links, test that a link is alive, and announce or withdraw the rkeys of the
// RMBs the peer may write into. Every message is exactly 44 bytes, sent with RDMA SEND
// into the peer's 48-byte receive slots; the same slots also receive CDC messages
// (type 0xFE, package rmb), so [Parse] reports those with [ErrCDC] and [IsCDC] tells
// them apart without parsing.
//
// The package is pure: no I/O, no goroutines, no clocks, no logging. The link state
// machine that sends and awaits these messages lives in the engine.
//
// # Use
//
//	m, err := llc.Parse(slot)          // slot: at least 44 bytes, extra bytes ignored
//	switch m := m.(type) {
//	case *llc.TestLink:
//		resp := *m
//		resp.Flags |= llc.FlagResponse  // echo the user data back
//		err = resp.Encode(sendBuf)     // writes sendBuf[:44], no allocation
//	}
//
// Each message type also has Decode (parse into an existing value, no allocation) and
// AppendBinary (the [encoding.BinaryAppender] form).
//
// # Version 2
//
// SMC-Rv2's LLC messages (v2.go, [ParseV2]) have type 0x20|type and a 16-bit length
// at bytes 1–2 in little-endian order, as Linux writes its u16 in host order on
// x86 (seen on the wire: "2c 00" for 44). ADD_LINK carries the RMBs' rkeys for the
// new link itself (88 bytes with one), REQ_ADD_LINK and DELETE_RKEY carry lists;
// such messages may exceed 44 bytes, so a version-2 link posts receive buffers of
// [MaxV2Len]. A one-device client refuses ADD_LINK with a 44-byte response.
//
// # Common header (all messages, all integers big-endian)
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|     type      | length = 44   | rsvd  |reason |     flags     |  0
//	+---------------+---------------+-------+-------+---------------+
//	|             body, 40 bytes, laid out per type below           |  4
//
//	flags   0x80 response (every type); the other bits depend on the type
//	reason  ADD_LINK reject reason (low nibble of byte 2); reserved elsewhere
//
// Reserved bytes are sent as zero and ignored on receipt: decoding then encoding a
// message reproduces it except for reserved bytes, which come out zero. The flags
// byte is kept whole, so flag bits this package does not name survive a round trip.
//
// # CONFIRM_LINK (type 0x01)
//
// Sent by the server on a new link, answered by the client; confirms the link works
// in both directions and tells the peer its QP, link number and link user ID.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|     0x01      |      44       |   reserved    |     flags     |  0
//	+---------------+---------------+---------------+---------------+
//	|                     sender MAC (6 bytes)                      |  4
//	+                               +-------------------------------+
//	|                               |                               |  8
//	+-------------------------------+                               +
//	|                     sender GID (16 bytes, at 10)              |  12
//	+                                                               +
//	|                                                               |  16
//	+                                                               +
//	|                                                               |  20
//	+                               +-------------------------------+
//	|                               |     sender QP number (24 bit) |  24
//	+---------------+---------------+---------------+---------------+
//	| QPN (low byte)|  link number  |    link user ID (4 bytes)     |  28
//	+---------------+---------------+---------------+---------------+
//	|   link UID (continued)        |   max links   |   reserved    |  32
//	+-------------------------------+---------------+---------------+
//	|                  reserved (bytes 35 to 43)                    |  36
//	+---------------------------------------------------------------+  44
//
//	flags   0x80 response
//	        0x03 "no RMBE eyecatchers" (Linux always sets both bits and refuses a
//	             CONFIRM_LINK with neither)
//
// # ADD_LINK (type 0x02)
//
//	+---------------+---------------+-------+-------+---------------+
//	|     0x02      |      44       | rsvd  |reason |     flags     |  0
//	+---------------+---------------+-------+-------+---------------+
//	|                     sender MAC (6 bytes)                      |  4
//	+                               +-------------------------------+
//	|                               |           reserved            |  8
//	+-------------------------------+-------------------------------+
//	|                     sender GID (16 bytes, at 12)              |  12
//	~                                                               ~
//	+-----------------------------------------------+---------------+
//	|          sender QP number (24 bit)            |  link number  |  28
//	+-------+-------+-------------------------------+---------------+
//	| rsvd  |  MTU  |         initial PSN (24 bit)                  |  32
//	+-------+-------+-----------------------------------------------+
//	|                  reserved (bytes 36 to 43)                    |  36
//	+---------------------------------------------------------------+  44
//
//	flags   0x80 response, 0x40 rejected
//	reason  1 no alternate path available, 2 invalid MTU (with 0x40)
//	MTU     low nibble of byte 32: 1..5 = 256..4096 bytes; 0 in a client's
//	        invitation (no new QP yet) and in rejections
//
// # ADD_LINK_CONT (type 0x03)
//
// Exchanges, per RMB, the rkey and address the new link must use. num rkeys is the
// number of rkeys still to send, counting those in this message; a message carries at
// most two, so a larger count means more ADD_LINK_CONT messages follow.
//
//	+---------------+---------------+---------------+---------------+
//	|     0x03      |      44       |   reserved    |     flags     |  0
//	+---------------+---------------+---------------+---------------+
//	|  link number  |   num rkeys   |           reserved            |  4
//	+---------------+---------------+-------------------------------+
//	|               rkey of the RMB on the existing link            |  8
//	+---------------------------------------------------------------+
//	|               rkey of the RMB on the new link                 |  12
//	+---------------------------------------------------------------+
//	|           virtual address of the RMB on the new link          |  16
//	+                          (8 bytes)                            +
//	|                                                               |  20
//	+---------------------------------------------------------------+
//	|            second {rkey, new rkey, new address}               |  24..39
//	~                          (16 bytes)                           ~
//	+---------------------------------------------------------------+
//	|                          reserved                             |  40
//	+---------------------------------------------------------------+  44
//
//	flags   0x80 response
//
// The pairs start at 8, after two reserved bytes, as in Linux's packed struct
// smc_llc_msg_add_link_cont; Wireshark 4.0 reads them from 6 and so shows them
// shifted.
//
// # DELETE_LINK (type 0x04)
//
//	+---------------+---------------+---------------+---------------+
//	|     0x04      |      44       |   reserved    |     flags     |  0
//	+---------------+---------------+---------------+---------------+
//	|  link number  |           reason code (u32) ...               |  4
//	+---------------+-----------------------------------------------+
//	|... reason     |           reserved (bytes 9 to 43)            |  8
//	~                                                               ~
//	+---------------------------------------------------------------+  44
//
//	flags   0x80 response, 0x40 all links (the link group ends), 0x20 orderly
//	reason  0x00010000 lost path, 0x00020000 operator initiated, 0x00030000 program
//	        initiated, 0x00040000 LLC protocol violation, 0x00050000 asymmetric link
//	        no longer needed; in responses 0x00100000 unknown link, 0x00200000
//	        unknown link group
//
// # CONFIRM_RKEY (type 0x06)
//
// Announces a new RMB: its rkey and address on the link carrying the message, then up
// to two {link number, rkey, address} for the group's other links. The first byte of
// the body counts those other rkeys (Linux sends at most two; a larger count means
// CONFIRM_RKEY_CONT messages follow).
//
//	+---------------+---------------+---------------+---------------+
//	|     0x06      |      44       |   reserved    |     flags     |  0
//	+---------------+---------------+---------------+---------------+
//	| num other rk. |     rkey on this link (u32) ...               |  4
//	+---------------+-----------------------------------------------+
//	|... rkey       |     address on this link (u64, bytes 9..16)   |  8
//	~                                                               ~
//	+---------------+-----------------------------------------------+
//	|... address    | link number   |  rkey (u32, bytes 18..21)     |  16
//	+---------------+---------------+-------------------------------+
//	|   first other link: address (u64, bytes 22..29)               |  20
//	~                                                               ~
//	+---------------+---------------+-------------------------------+
//	|   second other link: link number at 30, rkey at 31..34,       |  28
//	~   address at 35..42                                           ~
//	+-----------------------------------------------+---------------+
//	|                                               |   reserved    |  40
//	+-----------------------------------------------+---------------+  44
//
//	flags   0x80 response, 0x20 negative (rkey not accepted), 0x10 retry
//
// # TEST_LINK (type 0x07)
//
//	+---------------+---------------+---------------+---------------+
//	|     0x07      |      44       |   reserved    |     flags     |  0
//	+---------------+---------------+---------------+---------------+
//	|                 user data (16 bytes, echoed)                  |  4..19
//	~                                                               ~
//	+---------------------------------------------------------------+
//	|                  reserved (bytes 20 to 43)                    |  20
//	~                                                               ~
//	+---------------------------------------------------------------+  44
//
//	flags   0x80 response
//
// # CONFIRM_RKEY_CONT (type 0x08)
//
//	+---------------+---------------+---------------+---------------+
//	|     0x08      |      44       |   reserved    |     flags     |  0
//	+---------------+---------------+---------------+---------------+
//	|  num rkeys    | 3 × {link number (1), rkey (4), address (8)}  |  4
//	+---------------+  at 5, 18 and 31                              +
//	~                                                               ~
//	+---------------------------------------------------------------+  44
//
//	flags      0x80 response, 0x20 negative, 0x10 retry
//	num rkeys  rkeys still to confirm, counting those in this message (at most
//	           three are here)
//
// Linux (at most three links per group) never sends this message and ignores it.
//
// # DELETE_RKEY (type 0x09)
//
//	+---------------+---------------+---------------+---------------+
//	|     0x09      |      44       |   reserved    |     flags     |  0
//	+---------------+---------------+---------------+---------------+
//	|    count      |  error mask   |           reserved            |  4
//	+---------------+---------------+-------------------------------+
//	|                rkey 1 .. rkey 8 (u32 each, 8..39)             |  8
//	~                                                               ~
//	+---------------------------------------------------------------+
//	|                           reserved                            |  40
//	+---------------------------------------------------------------+  44
//
//	flags       0x80 response, 0x20 negative (some rkeys unknown)
//	count       rkeys in this message, 1..8
//	error mask  in a negative response, bit 0x80>>i set when rkey i+1 was unknown
//
// # Validation
//
// [Parse] and Decode check the length byte (44), the type, and every count before it
// is used: DELETE_RKEY's count must be 1..8 and its error mask may only flag rkeys
// that are present; ADD_LINK's MTU must be 0 or a defined code. The "remaining"
// counts of ADD_LINK_CONT, CONFIRM_RKEY and CONFIRM_RKEY_CONT may exceed what one
// message holds (more messages follow), so their Entries methods never return more
// than the message's slots. Encode refuses values its fields cannot hold (a QPN or PSN
// over 24 bits, an MTU or reason over 4 bits) and the same count rules.
package llc
