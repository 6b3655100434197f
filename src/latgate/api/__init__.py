"""Thin HTTP handlers: parse, call the gateway, render."""
