"""The dashboard's job submission form (the API's serializer checks the same fields)."""

from __future__ import annotations

from django import forms


class JobForm(forms.Form):
    file = forms.FileField(help_text="JSON Lines: one KServe v2 infer request body (JSON) per line")
    model = forms.CharField(max_length=128, help_text="a model of the model repository, e.g. linear")
    version = forms.CharField(max_length=32, required=False, help_text="empty: the latest ready version")
    deadline = forms.DateTimeField(help_text="UTC, e.g. 2026-12-04 18:00")
