//go:build !linux

package portlock

import "time"

func (k Keeper) hold(time.Duration, []*Lock) error { return ErrNoKeeper }

func (k Keeper) drop(string) (bool, error) { return false, nil }

func (k Keeper) renew(time.Duration) (int, error) { return 0, ErrNoKeeper }

func startOf(int) (uint64, error) { return 0, nil }

func (k Keeper) take(string) ([]handle, error) { return nil, nil }
