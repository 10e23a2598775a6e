package bandwidth

// Tracked is the number of buckets c holds.
func Tracked(c *Caps) int { return c.tracked() }
