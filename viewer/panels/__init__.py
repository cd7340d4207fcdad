"""The panels around the timeline, one widget each: selection, moment, findings, the
allocations table, annotations, allocator, what-if, compare, the legend and the devices."""
