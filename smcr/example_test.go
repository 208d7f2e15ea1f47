package smcr_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"

	"github.com/smcr-io/smcr/smcr"
	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/shm"
)

// Two endpoints on one host over the shared-memory provider: the server echoes,
// the client's bytes go by RDMA WRITE into the server's RMB once CLC agreed.
// Across hosts, the device is real RDMA (package ibv, built with -tags ibv) or
// the soft provider, and the two engines are two processes.
func Example() {
	dir, err := os.MkdirTemp("", "smcr-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// The caller owns the devices: they are closed after the engines.
	var devs []verbs.Device
	defer func() {
		for _, d := range devs {
			d.Close()
		}
	}()
	newEngine := func() *smcr.Engine {
		dev, err := shm.Open(shm.Config{Dir: dir})
		if err != nil {
			log.Fatal(err)
		}
		devs = append(devs, dev)
		e, err := smcr.NewEngine(smcr.Config{Devices: []verbs.Device{dev}})
		if err != nil {
			log.Fatal(err)
		}
		return e
	}
	server, client := newEngine(), newEngine()
	defer server.Close()
	defer client.Close()

	ln, err := server.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c) // echo until the client's CloseWrite
		c.Close()
	}()

	c, err := client.Dial(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Println("mode:", c.Mode(), "declined:", c.Decline() != nil)
	if _, err := c.Write([]byte("hello over SMC-R")); err != nil {
		log.Fatal(err)
	}
	c.CloseWrite()
	echo, err := io.ReadAll(c)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("echo: %s\n", echo)
	// Output:
	// mode: SMC-R declined: false
	// echo: hello over SMC-R
}
