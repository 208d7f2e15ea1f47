package rmb_test

import (
	"fmt"

	"github.com/smcr-io/smcr/rmb"
)

// One write of 20 bytes into a 16 KiB peer RMBE whose producer cursor sits 10 bytes
// before the end: two RDMA WRITEs, then a CDC carrying the new producer cursor.
func Example() {
	size, _ := rmb.DecodeSizeCode(0, rmb.DefaultMaxSizeCode)
	tx := rmb.NewProducer(size) // this end, writing into the peer
	rx := rmb.NewConsumer(size) // the peer, reading its RMBE

	// Earlier traffic: the ring filled up to 10 bytes before the end and was consumed.
	tx.Produce(size - 10)
	rx.OnPeerProducer(tx.Cursor())
	rx.Consume(size - 10)
	rx.Report()
	tx.OnPeerConsumer(rx.Cursor())

	first, second := tx.Spans(20)
	fmt.Println("write", first, "and", second)
	prod, _ := tx.Produce(first.Len + second.Len)

	var slot [rmb.CDCLen]byte
	msg := rmb.CDC{Seq: 2, Token: 0x1001, Prod: prod, Cons: rmb.Cursor{}}
	msg.Encode(slot[:])

	got, _ := rmb.ParseCDC(slot[:])
	added, stale, err := rx.OnPeerProducer(got.Prod)
	fmt.Println("producer cursor", got.Prod, "adds", added, stale, err)
	fmt.Println("readable", rx.Readable(), "update due", rx.UpdateDue(false))
	// Output:
	// write {16374 10} and {0 10}
	// producer cursor 1:10 adds 20 false <nil>
	// readable 20 update due false
}
