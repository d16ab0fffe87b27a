package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
)

// testServer is berth-testserver, a plain Go program the tests run under
// berth run or outside berth:
//
//	serve-once PORTFILE  take the socket berth run --listen passes (fd 3),
//	                     write "$WEB_PORT PID" to PORTFILE, accept one client,
//	                     tell it "pid PID started T" (monotonic() when it
//	                     started), and exit 1
//	listen ADDR          listen on ADDR, say "ready", run until a signal
//	record FILE          append "PID" to FILE, run until a signal
func testServer(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: berth-testserver serve-once PORTFILE | listen ADDR | record FILE")
		return 2
	}
	started := monotonic()
	switch args[0] {
	case "serve-once":
		if os.Getenv("LISTEN_FDS") != "1" || os.Getenv("LISTEN_PID") != strconv.Itoa(os.Getpid()) {
			fmt.Fprintf(os.Stderr, "berth-testserver: LISTEN_FDS=%q LISTEN_PID=%q; want 1 and %d\n", os.Getenv("LISTEN_FDS"), os.Getenv("LISTEN_PID"), os.Getpid())
			return 3
		}
		l, err := net.FileListener(os.NewFile(3, "web"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		if err := writeAtomic(args[1], os.Getenv("WEB_PORT")+" "+strconv.Itoa(os.Getpid())); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		fmt.Fprintf(c, "pid %d started %d\n", os.Getpid(), started)
		_ = c.Close()
		return 1 // on purpose: berth run --restart on-failure starts another
	case "listen":
		l, err := net.Listen("tcp", args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		defer l.Close()
		fmt.Println("ready")
		waitSignal()
		return 0
	case "record":
		f, err := os.OpenFile(args[1], os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		fmt.Fprintf(f, "%d\n", os.Getpid())
		_ = f.Close()
		waitSignal()
		return 0
	}
	fmt.Fprintf(os.Stderr, "berth-testserver: no mode %q\n", args[0])
	return 2
}

// waitSignal returns on SIGINT or SIGTERM.
func waitSignal() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	<-ch
}

func writeAtomic(path, s string) error {
	if err := os.WriteFile(path+".tmp", []byte(s), 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}
