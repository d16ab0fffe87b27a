// Package greeter is a small downstream package whose tests get their ports
// from berth: see greeter_test.go, and run it with
//
//	go test ./examples/gotest
package greeter

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Server answers every request with a greeting.
type Server struct {
	srv  *http.Server
	done chan error
}

// Start listens on addr and serves in the background until Close.
func Start(addr, name string) (*Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return Serve(l, name), nil
}

// Serve serves on l in the background until Close.
func Serve(l net.Listener, name string) *Server {
	s := &Server{done: make(chan error, 1)}
	s.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s\n", name)
	})}
	go func() { s.done <- s.srv.Serve(l) }()
	return s
}

// Close stops the server and waits until it has.
func (s *Server) Close() error {
	err := s.srv.Shutdown(context.Background())
	<-s.done
	return err
}
