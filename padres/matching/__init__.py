"""Matching: the relations between filters (covering, overlap), the reference matcher, and the
Rete and experta engines behind one ``Matcher`` interface."""
