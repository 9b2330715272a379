package mounts

// MountAt is mountAt, for the tests of the debugfs path.
var MountAt = mountAt
