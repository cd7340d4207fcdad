"""What a user reads, decided once (Qt-free): which frame of a stack is theirs and how a
frame is labelled (`stacks`), plain words for peak types, levers and findings (`words`),
and text made safe for HTML and Markdown (`markup`). The viewer, the report and the
command line call these; none of them words a fact on its own.
"""
