// Package listenfd passes bound sockets from a process to the children it
// starts the way systemd's socket activation does, and takes them in the
// child: a Handoff puts them at file descriptors 3, 4, ... with LISTEN_FDS
// and LISTEN_FDNAMES, and Inherit takes them back as listeners and packet
// conns by name. With portalloc's Listen, a socket is bound inside the
// transaction that reserves its port, so passing it on leaves no moment
// in which another program could take the port.
//
// The package is for Unix only: its files carry the build constraint
// "unix", and on other systems it is empty, because they have no
// inheritance of descriptors by number. Package portalloc itself is the
// same on every system.
package listenfd
