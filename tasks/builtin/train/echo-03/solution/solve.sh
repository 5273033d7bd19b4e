#!/bin/bash
echo pepper > answer.txt
