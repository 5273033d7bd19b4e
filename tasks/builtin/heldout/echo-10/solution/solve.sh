#!/bin/bash
echo raven > answer.txt
