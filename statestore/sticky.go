package statestore

import (
	"context"
	"database/sql"
	"errors"
	"net/netip"

	"github.com/berth-go/berth/store"
)

func (s *sqlStore) Remember(ctx context.Context, label string, protocol store.Protocol, port uint16) error {
	if label == "" {
		return &store.FieldError{Field: "label", Value: "", Want: "a non-empty label to remember the port under"}
	}
	if err := store.CheckLabel(label); err != nil {
		return err
	}
	if _, err := (store.Key{Protocol: protocol, Addr: netip.IPv4Unspecified(), Port: port}).Normalize(); err != nil {
		return err // the protocol or the port
	}
	_, err := s.exec(ctx, "remember "+label, nil, qRemember, label, string(protocol), int(port), s.now().UnixNano())
	if err != nil {
		return err
	}
	// Now and then only: counting the labels reads the table. The sweep does it too.
	if s.remembered.Add(1)%pruneStickyEvery == 0 {
		return s.pruneSticky(ctx)
	}
	return nil
}

// pruneStickyEvery is how many Remember calls pass between two prunes.
const pruneStickyEvery = 256

// pruneSticky forgets the oldest sticky ports beyond store.MaxSticky.
func (s *sqlStore) pruneSticky(ctx context.Context) error {
	_, err := s.exec(ctx, "forget old sticky ports", nil, qPruneSticky, store.MaxSticky)
	return err
}

func (s *sqlStore) Recall(ctx context.Context, label string, protocol store.Protocol) (uint16, bool, error) {
	release, err := s.acquire(ctx, false)
	if err != nil {
		return 0, false, acquireErr("recall", err)
	}
	defer release()
	var port int
	err = s.st.row(ctx, qRecall, label, string(protocol)).Scan(&port)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, storageErr("recall "+label, err)
	case port < 1 || port > 65535:
		return 0, false, nil
	}
	return uint16(port), true, nil
}
