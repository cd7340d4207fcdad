"""Qt-free services above the analysis, shared by the viewer and the command line: the
summary document, the report (Markdown + JSON; its PNG is drawn by the viewer's code),
exports (trimmed snapshot, Perfetto), and the user's annotations (the sidecar store).
"""
