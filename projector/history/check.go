package history

// Name names the history projector in set-aside records and their metric.
const Name = "history"
