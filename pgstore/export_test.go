package pgstore

// The hot lookups, for the plan tests.
const (
	QHolders = qHolders
	QScan    = qScan
)
