"""Where a slice goes and when: the allocator, the queue's order, the wait estimate, what a
kernel still holds, and what a start would do (the fit preview). Pure."""
