package statestore

import "context"

// ConvertLegacyOwners runs, for the external tests, the conversion of rows
// that earlier berth releases wrote.
func ConvertLegacyOwners(ctx context.Context, s *Store) (converted, deleted int, err error) {
	return s.convertLegacyOwners(ctx)
}
