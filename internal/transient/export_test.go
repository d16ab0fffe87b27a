package transient

// ForgetShortage forgets the last shortage of descriptors this process met,
// for tests that need DescriptorsShort to look at the present only.
func ForgetShortage() { lastShort.Store(0) }
