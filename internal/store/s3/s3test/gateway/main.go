// Command gateway is the S3-compatible server of toolhost's tests: VersityGW (embedgw and
// its posix backend) on one address, over one directory, with one root account. It is its
// own module so that VersityGW's large dependency tree reaches neither toolhost's go.mod
// nor any program that imports toolhost; package s3test builds it and runs it as a child
// process of the tests (which also keeps the backend's change of working directory out of
// the test process).
//
//	gateway -dir DIR -addr 127.0.0.1:PORT -access KEY -secret SECRET -region REGION
//
// It prints "ready" on stdout once it serves, and stops on SIGTERM, SIGINT or when its
// stdin closes (its parent died).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/versity/versitygw/backend/meta"
	"github.com/versity/versitygw/backend/posix"
	"github.com/versity/versitygw/embedgw"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "gateway: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	dir := flag.String("dir", "", "the directory of the buckets")
	addr := flag.String("addr", "127.0.0.1:0", "the address to serve on")
	access := flag.String("access", "", "the root account's access key")
	secret := flag.String("secret", "", "the root account's secret key")
	region := flag.String("region", "us-east-1", "the region")
	flag.Parse()
	if *dir == "" || *access == "" || *secret == "" {
		return fmt.Errorf("-dir, -access and -secret are required")
	}
	if err := (meta.XattrMeta{}).Test(*dir); err != nil {
		return fmt.Errorf("%s has no user xattrs: %w", *dir, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // owned by main: ends with the process
		io.Copy(io.Discard, os.Stdin)
		cancel() // the parent is gone
	}()

	// posix.New changes the working directory to dir and keeps bucket paths relative to it.
	be, err := posix.New(*dir, meta.XattrMeta{}, posix.PosixOpts{})
	if err != nil {
		return fmt.Errorf("posix backend: %w", err)
	}
	done := make(chan error, 1)
	go func() { // owned by main, which waits for it below
		done <- embedgw.RunVersityGW(ctx, be, &embedgw.Config{
			RootUserAccess:    *access,
			RootUserSecret:    *secret,
			Region:            *region,
			Ports:             []string{*addr},
			MaxConnections:    250,
			MaxRequests:       100,
			MultipartMaxParts: 10000,
			Quiet:             true,
		})
	}()
	// Ready once the port accepts connections.
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.DialTimeout("tcp", *addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case err := <-done:
			return fmt.Errorf("the gateway exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening on %s after 10s: %w", *addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Println("ready")
	if err := <-done; err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}
