package notifier

import "fmt"

// The supersede decision: a client never gets an older revision of a sensor after a newer
// one. A row that has not failed still goes out in revision order, so a healthy receiver
// gets every revision; a row that failed and waits for a retry is superseded by a newer
// one; a row whose attempt is in flight is flagged, and decided when that attempt ends.
// The decisions are pure functions of a row's facts. The statements that must take them
// under the rows' locks are parametrised by their results: enqueueStateSQL is built from
// enqueueState, supersede's UPDATE takes sweep's verdicts, finish's takes a finishPlan.

// rowFacts is what the supersede decision knows of a pending delivery row.
type rowFacts struct {
	attempted bool // an attempt of its schedule failed (attempts > 0)
	inFlight  bool // leased: an attempt may be under way
	flagged   bool // supersede_on_finish: a newer revision came while it was in flight
	newer     bool // the client has a higher revision of the sensor, in any state
}

// enqueueState is the state of a row entering the queue (ingested, or a dead one redriven):
// superseded when the client already has a newer revision of the sensor.
func enqueueState(newer bool) string {
	if newer {
		return StateSuperseded
	}
	return StatePending
}

// enqueueStateSQL is enqueueState as an SQL expression, given the SQL test for newer.
func enqueueStateSQL(newer string) string {
	return fmt.Sprintf(`CASE WHEN %s THEN '%s' ELSE '%s' END`, newer, enqueueState(true), enqueueState(false))
}

// sweepVerdict is what becomes of a pending row when newer revisions come.
type sweepVerdict int

const (
	sweepKeep      sweepVerdict = iota // left as it is
	sweepFlag                          // in flight: flagged, decided by finishState
	sweepSupersede                     // superseded now (and flagged)
)

// sweep decides for a pending row, after an ingest of its key or in the janitor's sweep.
func sweep(f rowFacts) sweepVerdict {
	switch {
	case !f.newer, !f.attempted && !f.inFlight:
		return sweepKeep
	case f.inFlight && f.flagged:
		return sweepKeep // flagged before
	case f.inFlight:
		return sweepFlag
	}
	return sweepSupersede
}

// finishState is the state a leased row is left in when its attempt ends: counted is false
// for an aborted attempt (the notifier stopping or giving the row back, not the receiver's
// answer), outcome the attempt's state (pending: retry). An aborted attempt supersedes a
// flagged row only if it had failed before, so a healthy receiver still gets every revision.
func finishState(f rowFacts, counted bool, outcome string) string {
	switch {
	case f.flagged && (counted && outcome == StatePending || !counted && f.attempted):
		return StateSuperseded
	case !counted:
		return StatePending
	case outcome == StatePending && f.newer:
		return StateSuperseded
	}
	return outcome
}

// finishPlan is finishState applied to what is known of an attempt before its finish, for
// finish's UPDATE to complete with the row's flag and newer revisions under its lock.
type finishPlan struct{ ifFlagged, ifNewer, otherwise string }

// planFinish is the finishPlan of an attempt of a row attempted before, or not.
func planFinish(attempted, counted bool, outcome string) finishPlan {
	f := rowFacts{attempted: attempted, inFlight: true}
	p := finishPlan{otherwise: finishState(f, counted, outcome)}
	f.newer = true
	p.ifNewer = finishState(f, counted, outcome)
	f.flagged = true
	p.ifFlagged = finishState(f, counted, outcome)
	return p
}

// finishStateSQL is what finish's UPDATE makes of the plan r (finishPlan.state): the flag
// first, then a newer revision, looked up only when it changes the answer.
const finishStateSQL = `CASE WHEN d.supersede_on_finish THEN r.if_flagged
		WHEN r.if_newer <> r.otherwise AND ` + newerExists + ` THEN r.if_newer
		ELSE r.otherwise END`

// state is finishStateSQL in Go, for the test that it agrees with finishState.
func (p finishPlan) state(flagged, newer bool) string {
	switch {
	case flagged:
		return p.ifFlagged
	case p.ifNewer != p.otherwise && newer:
		return p.ifNewer
	}
	return p.otherwise
}
