"""Tests of sandfleet.kube against the real local apiserver."""
