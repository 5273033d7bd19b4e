#!/bin/bash
echo kettle > answer.txt
