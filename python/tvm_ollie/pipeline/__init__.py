"""Composing the passes (floor 7 of DESIGN.md's layout): the joint build's never-worse guard."""
