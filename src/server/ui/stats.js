// Aggregates for the charts (issue 46): bounded per-second series folded from the log's
// events. Pure: no DOM, no I/O. (Filled in by the charts work.)
export {};
