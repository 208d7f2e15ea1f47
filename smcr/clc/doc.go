// Package clc is the codec of SMC-R's Connection Layer Control messages: Proposal,
// Accept, Confirm and Decline (RFC 7609 §3.7, laid out as Linux net/smc/smc_clc.h).
//
// CLC runs on the TCP connection before any application byte: the client sends a
// Proposal, the server answers Accept or Decline, the client answers Confirm or
// Decline. The package is pure: Parse and the AppendTo methods do no I/O, start no
// goroutines and read no clock. ReadMessage is the one function that reads, and only
// from the io.Reader it is given.
//
// All integers are big-endian. Every message starts with this 8-byte header and ends
// with the eyecatcher again as a 4-byte trailer; the length covers both.
//
//	 0               1               2               3
//	+-------+-------+-------+-------+-------+-------+-------+-------+
//	|  E2      D4      C3      D9   | type  |    length     |V|F|R|T|
//	+-------+-------+-------+-------+-------+-------+-------+-------+
//	 V: version, high nibble (1)   F: 0x08, first contact (Accept, Confirm),
//	 R: 0x04, reserved             out of sync (Decline); typev2 with R in a
//	 T: 0x03, SMC type (0 = SMC-R) version 2 Proposal
//
// Proposal (type 1), 92 bytes in Linux's IPv4 form, 52 in the old form whose
// iparea_offset is 0:
//
//	 8  peer ID (8)         2 random bytes + MAC of the first active RoCE port
//	16  GID (16)            preferred GID
//	32  MAC (6)             preferred MAC
//	38  iparea_offset (2)   bytes skipped after this field before the IP area: 40
//	40  skipped area        Linux: ISM GID (8), ISM CHID (2), v2 ext offset (2),
//	                        reserved (28); all zero for SMC-R version 1
//	 A  IPv4 subnet (4)     A = 40 + iparea_offset
//	A+4 prefix length (1)
//	A+5 reserved (2)
//	A+7 IPv6 prefix count N (1, at most 8)
//	A+8 N × {prefix (16), prefix length (1)}
//	 E  extension area      optional, opaque to version-1 peers (see Envelope)
//	    trailer (4)
//
// Accept (type 2, server's values) and Confirm (type 3, client's values), 68 bytes
// plus this project's optional extension area:
//
//	 8  peer ID (8)         16  GID (16)           32  MAC (6)
//	38  QPN (3)             41  RMB rkey (4)       45  RMBE index (1)
//	46  alert token (4)     50  size code << 4 | MTU code (1)
//	51  reserved (1)        52  RMB address (8)    60  reserved (1)
//	61  initial PSN (3)     64  extension area (optional), then trailer (4)
//
// Decline (type 4), 28 bytes:
//
//	 8  peer ID (8)         16  diagnosis code (4)
//	20  reserved (4)        24  trailer (4)
//
// Version 2 (byte 7's high nibble 2): a Proposal's SMC-D area, SMC-Rv2 and SMC-Dv2
// extensions, an Accept's and Confirm's EID, first-contact extension and GID list
// and the 44-byte Decline are drawn in v2.go (ProposalV2, LinkInfoV2); the release
// 2.1 negotiation is in negotiate.go. Version-2 lengths are exact, as Linux sends
// them, and version 2 carries no extension area of ours.
//
// Extension area: this project's extensions travel after the IPv6 prefixes of a
// Proposal and, only towards a peer whose Proposal carried one, between byte 64 and
// the trailer of an Accept or Confirm. Wireshark stops decoding after the prefixes and
// Linux finds the trailer by the length, so a version-1 peer never misreads them. The
// area holds one Envelope:
//
//	0  magic "SMCX" (4)    4  version (1)    5  length (2, whole envelope)
//	7  TLVs: {type (1), length (2, of the value), value}...
//
// What the codec checks and what it leaves to the engine: the codec checks framing
// (eyecatchers, type, version, length bounds for the type, the length matching the
// bytes), structure (iparea_offset inside the message, at most 8 IPv6 prefixes, an
// envelope's TLVs inside the envelope) and value ranges that are fixed by the protocol
// (MTU code 1..5; QPN and PSN are 24 bits by construction). The engine checks what
// depends on its state: the size code against its own bound (LinkInfo.Validate), the
// RMBE index, rkey, RMB address and alert token against its link group, the subnet and
// prefix lengths against its interfaces (declining with DeclineIPSubnetMismatch), and
// the SMC type of a Proposal. Reserved bytes and bits are ignored on input and sent as
// zero, as Linux does.
package clc
