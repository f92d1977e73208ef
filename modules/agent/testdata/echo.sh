#!/bin/sh
# Answers with what it read: the request and its metadata.
cat
