//! Records, wire protocol and store reader shared by every ttrace component (capture path: issue 4, reader: issue 5).
