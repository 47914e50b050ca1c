// Package lab runs the watermark lab behind `tidemark lab offsets`: a small
// script of assignments, deliveries, completions, fetch positions, revokes
// and losses for one partition, replayed through [rebalance.Table] so that
// anyone can follow, step by step, which offset is safe to commit and why.
//
// The script language, one operation per line ('#' starts a comment):
//
//	assign EPOCH START   (re)assign the partition; EPOCH must increase
//	deliver OFF [OFF...] records delivered in this order
//	complete OFF [EPOCH] a completion notice (EPOCH defaults to the current one)
//	position POS         the fetcher's position, above the last delivered offset
//	revoke               normal revoke: commit the safe offset
//	lost                 ownership lost: commit nothing
//
// A malformed script is reported as a [*ScriptError] naming its line. The
// three built-in scripts are listed by [Cases].
package lab
