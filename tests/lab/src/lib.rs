//! agent-retry's lab: the refund lab of "Agent Retry Policies: When to Retry a Tool, Replan the Task or Give Up" on a written-down fault mix, Brooker's
//! contention simulation, the outage of a server with and without circuit
//! breakers, their plots, and the benchmark runner. Every decision
//! that is our policy's comes from the component; the other policies are written
//! here as the comparison.

pub mod contention;
pub mod faults;
pub mod lab;
pub mod outage;
pub mod plots;
pub mod report;
pub mod rng;
